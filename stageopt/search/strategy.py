"""Which search runs: the exact census, census-guided confirmation, Optuna sampling, or the co-design outer loop.

Why one dispatcher: the choice depends on three facts known before the first
simulation — is the backend the analytical model (cheap) or an expensive one,
is the space enumerable (no continuous hardware range), and what ``--sampler``
asked for — and every mode must leave the same kind of study behind.

| backend | space | ``--sampler`` | mode |
| --- | --- | --- | --- |
| analytical | enumerable | auto, brute, grid | ``exact``: the census is the answer |
| expensive | enumerable | auto | ``confirm``: census ranks, residual model guides the budget |
| expensive | enumerable | brute, grid | ``confirm`` in plain analytical order |
| any | hardware ranges | auto, tpe, nsga2, cmaes, ... | ``outer``: Optuna on hardware, exact census per candidate |
| any | enumerable | tpe, nsga2, gp, cmaes, random | ``sample``: the Optuna ask/tell loop |
| any | plan part above 2M combinations | auto | ``sample`` with TPE |
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stageopt.search.cache import StudyCache
from stageopt.search.census import Census
from stageopt.search.driver import LoopStats, SearchLoop, best_outcomes
from stageopt.search.objective import Objective, Outcome
from stageopt.search.samplers import CENSUS_SAMPLERS
from stageopt.search.space import SearchSpace


def pick_mode(sampler: str, expensive: bool, space: SearchSpace) -> str:
    from stageopt.search.census import MAX_ENUMERATE

    if not space.enumerable or (space.size() > MAX_ENUMERATE and space.hardware_dims):
        return "outer"
    if space.size() > MAX_ENUMERATE:
        return "sample"  # too many plans to enumerate: Optuna samples (the census is then a seeded sample)
    if sampler in CENSUS_SAMPLERS:
        return "confirm" if expensive else "exact"
    return "sample"


@dataclass
class Answer:
    """What a search found, in the terms every mode shares."""

    mode: str
    stats: LoopStats
    cache: StudyCache
    best: list[Outcome]  # the backend's best plan, or its Pareto front
    analytical_best: list[Outcome] = field(default_factory=list)  # the census's (for side-by-side)
    lines: list[str] = field(default_factory=list)  # one-line statements for the user
    loop: SearchLoop | None = None
    scored: int | None = None  # exact mode: plans the census scored (its simulations)

    @property
    def simulations(self) -> int:
        return self.scored if self.scored is not None else len(self.cache.simulated)


def comparison_lines(best: list[Outcome], census: Census | None, objectives: tuple[Objective, ...],
                     backend: str, mode: str) -> list[str]:
    """Say how the answer relates to the census's exact analytical optimum."""
    if census is None or not census.exhaustive or not best or len(objectives) > 1:
        return []
    exact = census.ranked(objectives, 1)
    if not exact:
        return []
    obj = objectives[0]
    a, b = obj.value(exact[0].record), obj.value(best[0].record)
    if backend == "analytical":
        if mode == "exact" or exact[0].key == best[0].key:
            return []
        gap = (b / a - 1) if obj.direction == "minimize" else (a / b - 1)
        return [f"note: the census's exact optimum is {gap:.1%} better than what the {mode} search found: "
                f"{obj.label} {a:.4g} with {exact[0].record['plan']}"]
    rank = census.row(best[0].key)
    pos = [int(r) for r in census.ranked_rows(objectives)].index(rank) + 1 if rank is not None else None
    where = f"analytical rank {pos:,} of {census.n_feasible:,}" if pos else "outside the analytical ranking"
    return [f"analytical optimum: {obj.label} {a:.4g} (analytical) with {exact[0].record['plan']}",
            f"confirmed optimum ({backend}): {obj.label} {b:.4g} with {best[0].record['plan']} ({where})"]


def sampled_answer(loop: SearchLoop, census: Census | None, objectives: tuple[Objective, ...],
                   backend: str) -> Answer:
    stats = loop.run()
    best = loop.best()
    return Answer(mode="sample", stats=stats, cache=loop.cache, best=best,
                  analytical_best=census.ranked(objectives, 1) if census is not None and census.exhaustive else [],
                  lines=comparison_lines(best, census, objectives, backend, "sample"), loop=loop)


def census_answer(mode: str, stats: LoopStats, cache: StudyCache, census: Census,
                  objectives: tuple[Objective, ...], backend: str, lines: list[str]) -> Answer:
    best = best_outcomes(cache.outcomes(), objectives, backend)
    return Answer(mode=mode, stats=stats, cache=cache, best=best, analytical_best=census.front(objectives),
                  lines=lines + comparison_lines(best, census, objectives, backend, mode),
                  scored=len(census) if mode == "exact" else None)

