"""Results that were not asked for through ``Study.ask`` (census plans, confirmed plans) as real trials.

Why real trials: optuna-dashboard, ``study.best_trial``, ``stageopt report`` and a
later ``--resume`` read the study and nothing else. A plan chosen by the census
or by the confirmation loop is stored exactly as a sampled one would be: its
parameters in the space's distributions, its objective values, its constraints
(``valid``, ``memory_gib``) and its record, so the study's best trial is the
answer the search printed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from stageopt.search.cache import RESULT_ATTR, stored_result
from stageopt.search.objective import FAILED, Objective, Outcome
from stageopt.search.space import SearchSpace, encode_choices


def outcome_trial(space: SearchSpace, choices: Mapping[str, Any], outcome: Outcome,
                  objectives: tuple[Objective, ...], *, simulated: bool,
                  extra: Mapping[str, Any] | None = None) -> optuna.trial.FrozenTrial:
    """A finished trial for ``outcome`` of the plan chosen by ``choices`` (failed: state FAIL, no values)."""
    dists = space.distributions()
    params = encode_choices(space, choices)
    attrs = {RESULT_ATTR: stored_result(outcome, simulated=simulated, cached=False), **(extra or {})}
    if outcome.status == FAILED:
        return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params=params, distributions=dists,
                                         user_attrs=attrs)
    return optuna.trial.create_trial(values=outcome.values(objectives), params=params, distributions=dists,
                                     user_attrs=attrs, constraints=outcome.constraints())


def add_outcomes(study: optuna.Study, space: SearchSpace, items: Iterable[tuple[Mapping[str, Any], Outcome]],
                 objectives: tuple[Objective, ...], *, simulated: bool,
                 extra: Mapping[str, Any] | None = None) -> int:
    """Store each (choices, outcome) as a trial, in order (the best first keeps ties on it); returns the count."""
    trials = [outcome_trial(space, ch, o, objectives, simulated=simulated, extra=extra) for ch, o in items]
    study.add_trials(trials)
    return len(trials)


def tell_trial(study: optuna.Study, trial: optuna.trial.Trial, outcome: Outcome, objectives: tuple[Objective, ...],
               *, simulated: bool, cached: bool = False) -> None:
    """Tell an asked trial its outcome the same way (record, constraints, values; FAIL when it failed)."""
    trial.set_user_attr(RESULT_ATTR, stored_result(outcome, simulated=simulated, cached=cached))
    if outcome.status == FAILED:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    for name, value in outcome.constraints().items():
        trial.set_constraint(name, value)
    study.tell(trial, outcome.values(objectives))
