"""The exact answer of an enumerable space under the analytical model: the census's optimum, top-k and front.

Why no sampling: when every valid plan has been scored (the census), a sampler can
only find the same optimum or a worse one. The search then records the exact
top-k and the exact Pareto front as trials (best first, so the study's best trial
is the optimum), says so in one line, and spends no budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from stageopt.search.cache import ResultCache
from stageopt.search.census import Census
from stageopt.search.objective import Objective, Outcome
from stageopt.search.record import add_outcomes
from stageopt.search.space import SearchSpace

DEFAULT_TOP = 10


@dataclass(frozen=True)
class ExactResult:
    front: list[Outcome]  # the optimum (one objective) or the exact Pareto front
    top: list[Outcome]  # the best ``top`` plans, best first
    recorded: int  # trials added to the study now
    line: str  # what the search says about it


def exact_search(study: optuna.Study, space: SearchSpace, census: Census, objectives: tuple[Objective, ...],
                 cache: ResultCache, top: int = DEFAULT_TOP) -> ExactResult:
    """Record the census's top plans and front as trials (those not stored yet) and describe the answer."""
    best = census.ranked(objectives, top)
    front = census.front(objectives)
    keep = {o.key: o for o in [*best, *front]}
    fresh = [(census.choices_of(k), o) for k, o in keep.items() if k not in cache]
    for _, outcome in fresh:
        cache.put(outcome, simulated=True)
    recorded = add_outcomes(study, space, fresh, objectives, simulated=True)
    what = "optimum" if len(objectives) == 1 else f"Pareto front ({len(front)} plans)"
    line = (f"exact: the analytical model scored every valid plan of the space ({len(census):,} canonical plans from "
            f"{census.combos:,} combinations, {census.merged:,} restating another, {census.n_feasible:,} fit); "
            f"the {what} and top {len(best)} below are exact, no sampling needed")
    return ExactResult(front=front, top=best, recorded=recorded, line=line)
