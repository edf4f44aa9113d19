"""Co-design as an outer loop: Optuna searches the hardware, each hardware candidate gets its exact best plan.

Why split: hardware dimensions can be continuous (scale-out bandwidth, HBM
capacity, NVLink domain size) or too many to cross with every plan, while the plan
part of a space is small enough for the census to score exactly in a fraction of a
second. So each Optuna trial suggests only the hardware (GPU count, preset, any
hardware field: TPE by default, CMA-ES or NSGA-II with ``--sampler``), the census
of the plan part on that machine gives its exact best plan (for several objectives:
the plan first in preferred order of its front), and the trial is told that plan's
values. With an expensive backend that one plan is simulated, so the budget counts
simulations as everywhere else; with the analytical model it counts hardware
candidates. A hardware candidate proposed again is told its earlier result (no cost).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import optuna

from stageopt.errors import StageoptError
from stageopt.search.cache import ResultCache
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.census import take_census
from stageopt.search.dimensions import Dimension, Value
from stageopt.search.driver import LoopStats, best_outcomes
from stageopt.search.executors import RayExecutor
from stageopt.search.objective import (
    OK,
    Objective,
    Outcome,
    estimate_outcome,
    failed_outcome,
    invalid_outcome,
)
from stageopt.search.record import tell_trial
from stageopt.search.space import SearchSpace
from stageopt.search.strategy import Answer
from stageopt.sim.base import Estimate


def hardware_space(space: SearchSpace, chosen: dict[str, Value]) -> SearchSpace:
    """The plan part of ``space`` on one hardware candidate (every hardware dimension fixed to one value)."""
    fixed = tuple(Dimension(name=d.name, values=(chosen[d.name],)) for d in space.hw_dims)
    gpus = (int(chosen.get("gpus", space.gpus[0])),)  # type: ignore[arg-type]
    return dataclasses.replace(space, gpus=gpus, hw_dims=fixed)


def best_plan(space: SearchSpace, catalog: HardwareCatalog, chosen: dict[str, Value],
              objectives: tuple[Objective, ...]) -> tuple[Outcome, dict[str, Value] | None]:
    """The census's best plan on one hardware candidate and its choices (invalid, None: no plan fits)."""
    sub = hardware_space(space, chosen)
    census = take_census(sub, HardwareCatalog(sub, reserve_gib=catalog.reserve_override))
    ranked = census.ranked(objectives, 1)
    if ranked:
        return ranked[0], sub.complete(census.choices_of(ranked[0].key))
    return invalid_outcome(_hw_key(chosen), f"no plan fits on this hardware ({len(census):,} valid plans, "
                                            "none within memory)"), None


def _hw_key(chosen: dict[str, Value]) -> str:
    return "hardware: " + " ".join(f"{k}={v}" for k, v in sorted(chosen.items()))


def outer_search(*, study: optuna.Study, space: SearchSpace, objectives: tuple[Objective, ...],
                 catalog: HardwareCatalog, cache: ResultCache, executor: RayExecutor | None, budget: int,
                 backend: str, sync: Callable[[], None]) -> Answer:
    """Ask hardware, settle each with its exact best plan (simulated when the backend is expensive), tell."""
    stats = LoopStats()
    seen: dict[str, Outcome] = {}
    names = [d.name for d in space.hardware_dims]
    try:
        while len(seen) < budget and stats.asks < 20 * budget:
            trial = study.ask()
            stats.asks += 1
            chosen = space.complete({d.name: d.suggest(trial) for d in space.hardware_dims})
            mark = " ".join(f"{n}={chosen[n]}" for n in names)
            cached = mark in seen
            if not cached:
                seen[mark] = _settle(space, catalog, chosen, objectives, executor, backend, cache)
            stats.cached += cached
            tell_trial(study, trial, seen[mark], objectives, simulated=not cached, cached=cached)
            stats.told += 1
            sync()
        stats.stop_reason = "budget" if len(seen) >= budget else "ask cap reached (the hardware space repeats)"
    finally:
        if executor is not None:
            executor.close()
        stats.elapsed_s = time.perf_counter() - stats.started
    best = best_outcomes(cache.outcomes(), objectives, backend)
    line = (f"co-design: {len(seen):,} hardware candidates searched by Optuna, each with the exact best plan of "
            f"its census{' confirmed by ' + backend if executor is not None else ''}")
    return Answer(mode="outer", stats=stats, cache=cache, best=best, lines=[line])


def _settle(space: SearchSpace, catalog: HardwareCatalog, chosen: dict[str, Value], objectives: tuple[Objective, ...],
            executor: RayExecutor | None, backend: str, cache: ResultCache) -> Outcome:
    try:
        outcome, choices = best_plan(space, catalog, chosen, objectives)
    except StageoptError as err:
        outcome, choices = invalid_outcome(_hw_key(chosen), str(err)), None
    if choices is None or executor is None:
        cache.put(outcome, simulated=outcome.status == OK)
        return outcome
    sub = hardware_space(space, chosen)
    sub_catalog = HardwareCatalog(sub, reserve_gib=catalog.reserve_override)
    cand = make_candidate(sub, sub_catalog, choices)
    hw = sub_catalog.get(cand.hw_key)
    executor.submit(cand.key, cand, hw)
    (_, result), = executor.poll(wait_all=True)
    if isinstance(result, Estimate):
        outcome = estimate_outcome(cand, result, hw.gpu.hbm_gib, sub_catalog.price(cand.hw_key), backend,
                                   sub_catalog.reserve(cand.hw_key))
    else:
        outcome = failed_outcome(cand, result, backend)
    cache.put(outcome, simulated=True)
    return outcome
