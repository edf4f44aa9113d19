"""Plans chosen without the sampler (census answers, confirmed plans) as ordinary trials of the study.

Why ordinary trials: optuna-dashboard, ``study.best_trial``, ``stageopt report``,
``--resume`` and other workers read the study and nothing else. A plan chosen by
the census or by the confirmation loop is stored exactly as a sampled one: its
parameters under their own names and values in the space's distributions, and
its result told by the same rules (:func:`~stageopt.search.cache.tell_outcome`:
COMPLETE with its objective values when it runs and fits, PRUNED with its
constraint values when it does not, FAIL when the simulator failed, flat
attributes either way). Each plan is stored once: the study's claim lock decides,
so two workers recording the same census add it once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from stageopt.search.cache import StudyCache, finished_trial
from stageopt.search.objective import Objective, Outcome
from stageopt.search.space import SearchSpace, encode_choices
from stageopt.search.workers import HeartbeatKeeper, ask_owned


def add_outcomes(cache: StudyCache, space: SearchSpace, items: Iterable[tuple[Mapping[str, Any], Outcome]],
                 objectives: tuple[Objective, ...], *, simulated: bool) -> int:
    """Store each (choices, outcome) as a finished trial, in order, unless the study holds its plan; the count."""
    dists = space.distributions()
    trials = [(o.key, finished_trial(encode_choices(space, ch), dists, o, objectives, simulated=simulated))
              for ch, o in items]
    return cache.add_finished(trials)


def open_trial(study: optuna.Study, space: SearchSpace, choices: Mapping[str, Any],
               heartbeat: HeartbeatKeeper | None) -> optuna.trial.Trial:
    """A RUNNING trial whose parameters are ``choices`` (what ``ask`` plus the space's suggestions store).

    It carries its owner and a heartbeat like an asked trial, so a worker that dies
    while simulating it has it failed by the others and its plan simulated again.
    """
    params, dists = encode_choices(space, choices), space.distributions()
    if heartbeat is None:
        template = optuna.trial.create_trial(state=TrialState.RUNNING, params=params, distributions=dists)
        return optuna.trial.Trial(study, study._storage.create_new_trial(study._study_id, template_trial=template))
    trial = ask_owned(study, heartbeat.owner, params, dists)
    heartbeat.add(trial._trial_id)
    return trial
