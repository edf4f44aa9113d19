"""The exact answer of an enumerable space under the analytical model: the census's optimum, top-k and front.

Why no sampling: when every valid plan has been scored (the census), a sampler can
only find the same optimum or a worse one. The search then records the exact
top-k and the exact Pareto front as trials (best first, so the study's best trial
is the optimum; ``--seed-plan`` plans after them), says so in one line, and spends no budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stageopt.search.cache import StudyCache
from stageopt.search.candidate import Candidate
from stageopt.search.census import Census
from stageopt.search.dimensions import Value
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


def exact_search(space: SearchSpace, census: Census, objectives: tuple[Objective, ...], cache: StudyCache,
                 top: int = DEFAULT_TOP, seeds: Sequence[tuple[dict[str, Value], Candidate]] = ()) -> ExactResult:
    """Record the census's top plans and front as trials (those the study does not hold yet), best first,
    then the ``--seed-plan`` plans (so a plan the user knows is in the study with its result, fitting or
    not), and describe the answer."""
    best = census.ranked(objectives, top)
    front = census.front(objectives)
    keep = {o.key: (census.choices_of(o.key), o) for o in [*best, *front]}
    for choices, cand in seeds:
        keep.setdefault(cand.key, (choices, census.outcome(cand.key)))
    recorded = add_outcomes(cache, space, list(keep.values()), objectives, simulated=True)
    what = "optimum" if len(objectives) == 1 else f"Pareto front ({len(front)} plans)"
    line = (f"exact: the analytical model scored every valid plan of the space ({len(census):,} canonical plans from "
            f"{census.combos:,} combinations, {census.merged:,} restating another, {census.n_feasible:,} fit); "
            f"the {what} and top {len(best)} below are exact, no sampling needed")
    return ExactResult(front=front, top=best, recorded=recorded, line=line)
