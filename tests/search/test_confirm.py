"""With an expensive backend the census ranks every plan and the budget confirms: a plan the analytical
model ranks low but the backend finds best is found by the residual model, and missed by analytical order.
Several workers confirming one study share its budget and never simulate a plan twice.

In process, with an executor that runs the stand-in backend inline: what is tested is which plans the
confirmation chooses and what it tells the study (Ray itself: ``test_ray.py``)."""

from __future__ import annotations

import numpy as np
import optuna
from optuna.trial import TrialState
from search_doubles import SKEW, InlineExecutor, SkewedSimulator

from conftest import SMALL
from stageopt.search.cache import StudyCache
from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.confirm import Confirmation, ConfirmConfig
from stageopt.search.objective import objectives_for
from stageopt.search.space import load_space
from stageopt.search.strategy import census_answer

TIME = objectives_for(("time",))
BUDGET = 12


def _skewed_truth(census) -> tuple[str, int]:
    """The skewed backend's optimum over every feasible plan, and its analytical rank (1 = best)."""
    rows = census.ranked_rows(TIME)
    t = census.arrays["iteration_time_s"][rows] * np.array([SKEW if census.cands[r].plan.tp == 8 else 1.0
                                                            for r in rows])
    best = int(np.argmin(t))
    return str(census.cands[rows[best]].plan), best + 1


def _confirm(study: optuna.Study, census, use_model: bool, budget: int = BUDGET):
    space, catalog = census.space, census.catalog
    executor = InlineExecutor(SkewedSimulator())
    cache = StudyCache(study)
    conf = Confirmation(study=study, space=space, census=census, objectives=TIME, catalog=catalog, cache=cache,
                        executor=executor, config=ConfirmConfig(budget=budget, backend="skewed", use_model=use_model))
    stats = conf.run()
    return census_answer("confirm", stats, cache, census, TIME, "skewed", []), executor


def test_residual_model_finds_a_plan_the_analytical_model_ranks_low() -> None:
    space = load_space(str(SMALL))
    census = take_census(space, HardwareCatalog(space))
    plan, rank = _skewed_truth(census)
    assert rank > BUDGET  # analytical order alone cannot reach it within the budget
    plain, _ = _confirm(optuna.create_study(), census, use_model=False)
    assert plain.simulations == BUDGET and plain.best[0].record["plan"] != plan
    study = optuna.create_study()
    out, executor = _confirm(study, census, use_model=True)
    assert out.simulations == BUDGET and len(set(executor.submitted)) == BUDGET
    assert out.best[0].record["plan"] == plan
    assert out.lines[0].startswith("analytical optimum:") and out.lines[1].startswith("confirmed optimum (skewed)")
    assert out.analytical_best[0].record["plan"] != plan
    assert study.best_trial.user_attrs["plan"] == plan and study.best_trial.user_attrs["backend"] == "skewed"
    assert set(study.best_trial.params) == {"tp", "pp", "mbs", "zero", "recompute"}


def test_workers_confirming_one_study_share_its_budget() -> None:
    space = load_space(str(SMALL))
    census = take_census(space, HardwareCatalog(space))
    study = optuna.create_study()
    first, a = _confirm(study, census, use_model=True, budget=10)
    second, b = _confirm(study, census, use_model=True, budget=14)  # joins the same study with a larger budget
    assert len(a.submitted) == 10 and len(b.submitted) == 4 and not set(a.submitted) & set(b.submitted)
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    keys = [t.user_attrs["key"] for t in done]
    assert len(keys) == len(set(keys)) == 14 and not study.get_trials(states=(TrialState.RUNNING,))
