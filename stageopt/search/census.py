"""Enumerate a space's plans and screen them analytically: feasible count, empty-space diagnosis, ranking.

Why before searching: the analytical model scores ~40,000 plans/s, so for every
shipped space the whole candidate set is screened in about a second. That lets
the search (1) refuse a space with no feasible plan at once and say why ("no plan
fits 80 GiB: smallest needs 112 GiB at tp=8 pp=16"), (2) stop when every feasible
plan has been simulated, (3) with ``--screen analytical``, hand an expensive
backend the most promising plans first, and (4) give the exact optimum of the
analytical model for checks (``exhaustive_best``). Spaces too large to enumerate
are screened on a seeded random sample, and the count is then a lower bound.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

from stageopt.errors import ConfigError, StageoptError
from stageopt.search.candidate import Candidate, HardwareCatalog, make_candidate
from stageopt.search.dimensions import Value
from stageopt.search.executors import analytical_estimates
from stageopt.search.objective import OK, Objective, Outcome, estimate_outcome
from stageopt.search.space import SearchSpace

MAX_ENUMERATE = 400_000


@dataclass(frozen=True, slots=True)
class Census:
    """Screened candidates of a space (feasible ones first-class) and how complete the list is."""

    combos: int
    exhaustive: bool
    choices: dict[str, dict[str, Value]]  # key -> one choice dict that produces it
    outcomes: dict[str, Outcome]  # key -> analytical outcome (valid candidates only)
    invalid_reasons: Counter

    @property
    def feasible(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.status == OK]

    def ranked(self, objectives: tuple[Objective, ...]) -> list[Outcome]:
        """Feasible outcomes by Pareto rank, then by the first objective."""
        feas = self.feasible
        if not feas:
            return []
        signs = np.array([1.0 if o.direction == "minimize" else -1.0 for o in objectives])
        values = np.array([o.values(objectives) for o in feas]) * signs
        ranks = pareto_ranks(values)
        order = np.lexsort((values[:, 0], ranks))
        return [feas[i] for i in order]


def pareto_ranks(values: np.ndarray) -> np.ndarray:
    """Non-domination rank (0 = Pareto front) of each row, all columns minimized."""
    n = len(values)
    ranks = np.full(n, -1)
    if values.shape[1] == 1:
        return np.zeros(n, dtype=int)
    remaining = np.arange(n)
    rank = 0
    while remaining.size:
        sub = values[remaining]
        dominated = np.zeros(len(sub), dtype=bool)
        for i in range(len(sub)):
            le = np.all(sub <= sub[i], axis=1) & np.any(sub < sub[i], axis=1)
            dominated[i] = le.any()
        ranks[remaining[~dominated]] = rank
        remaining = remaining[dominated]
        rank += 1
    return ranks


def take_census(space: SearchSpace, catalog: HardwareCatalog, seed: int = 0) -> Census:
    """Enumerate (or sample) the space, keep valid candidates, screen them with the analytical model."""
    dims = space.dims
    names = [d.name for d in dims]
    total = space.size()
    exhaustive = total <= MAX_ENUMERATE
    if exhaustive:
        combos = itertools.product(*[d.values for d in dims])
    else:
        rng = random.Random(seed)
        combos = (tuple(rng.choice(d.values) for d in dims) for _ in range(MAX_ENUMERATE))
    cands: dict[str, Candidate] = {}
    choices: dict[str, dict[str, Value]] = {}
    reasons: Counter = Counter()
    for combo in combos:
        chosen = dict(zip(names, combo))
        try:
            cand = make_candidate(space, catalog, space.complete(chosen))
        except StageoptError as err:
            reasons[_rule(str(err))] += 1
            continue
        if cand.key not in cands:
            cands[cand.key] = cand
            choices[cand.key] = chosen
    keys = list(cands)
    estimates = analytical_estimates(space.model, catalog, [cands[k] for k in keys]) if keys else []
    outcomes = {k: estimate_outcome(cands[k], est, catalog.get(cands[k].hw_key).gpu.hbm_gib,
                                    catalog.price(cands[k].hw_key), "analytical")
                for k, est in zip(keys, estimates)}
    return Census(combos=total, exhaustive=exhaustive, choices=choices, outcomes=outcomes, invalid_reasons=reasons)


def _rule(message: str) -> str:
    """The rule an InfeasiblePlan message names, without its numbers, for counting."""
    text = message.removeprefix("plan: ")
    return text.split(";")[0]


def require_feasible(census: Census, space: SearchSpace) -> None:
    """Raise a one-line ConfigError saying why no plan of the space can run."""
    if census.feasible:
        return
    scope = "" if census.exhaustive else f" (in a sample of {MAX_ENUMERATE:,} combinations)"
    if not census.outcomes:
        rule, count = census.invalid_reasons.most_common(1)[0] if census.invalid_reasons else ("?", 0)
        raise ConfigError(f"space {space.name}: no valid plan{scope}: all {census.combos:,} combinations break a "
                          f"rule, most often '{rule}' ({count:,}); widen plan choices or change gpus/global_batch")
    smallest = min(census.outcomes.values(), key=lambda o: o.record["peak_memory_gib"] - o.record["hbm_gib"])
    rec = smallest.record
    raise ConfigError(f"space {space.name}: no plan fits {rec['hbm_gib']:g} GiB{scope}: smallest needs "
                      f"{rec['peak_memory_gib']:.0f} GiB at {rec['plan']} on {rec['hardware']}; allow larger "
                      "tp/pp/cp, zero or recompute=full, or more GPUs/HBM")
