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
candidates. The trial's parameters are the hardware; its attributes name the plan.
A hardware candidate proposed again is a repeat of the plan it got (PRUNED,
``repeat_of``), claimed in the study like every plan, so workers that ``--join``
share one budget. Hardware on which no plan fits is told PRUNED with the memory
overflow of its least-memory plan, so the sampler learns which way to go.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import optuna

from stageopt.console.progress import progress
from stageopt.errors import StageoptError
from stageopt.search.cache import StudyCache, tell_outcome, tell_repeat, tell_unevaluated
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.census import Census, take_census
from stageopt.search.dimensions import Dimension, Value
from stageopt.search.driver import LoopStats, best_outcomes
from stageopt.search.executors import RayExecutor
from stageopt.search.objective import FAILED, INVALID, OOM, Objective, Outcome, estimate_outcome, failed_outcome, invalid_outcome
from stageopt.search.space import SearchSpace
from stageopt.search.strategy import Answer
from stageopt.search.workers import HeartbeatKeeper, ask_beaten
from stageopt.sim.base import Estimate

Settled = tuple[Outcome, "dict[str, Value] | None"]


def hardware_space(space: SearchSpace, chosen: dict[str, Value]) -> SearchSpace:
    """The plan part of ``space`` on one hardware candidate (every hardware dimension fixed to one value)."""
    fixed = tuple(Dimension(name=d.name, values=(chosen[d.name],)) for d in space.hw_dims)
    gpus = (int(chosen.get("gpus", space.gpus[0])),)  # type: ignore[arg-type]
    return dataclasses.replace(space, gpus=gpus, hw_dims=fixed)


def best_plan(space: SearchSpace, catalog: HardwareCatalog, chosen: dict[str, Value],
              objectives: tuple[Objective, ...]) -> Settled:
    """The census's best plan on one hardware candidate and its choices; when none fits, the plan that
    needs the least memory (over memory) and no choices; invalid when no plan is valid at all."""
    sub = hardware_space(space, chosen)
    census = take_census(sub, HardwareCatalog(sub, reserve_gib=catalog.reserve_override))
    ranked = census.ranked(objectives, 1)
    if ranked:
        return ranked[0], sub.complete(census.choices_of(ranked[0].key))
    return _nothing_fits(census, chosen), None


def _nothing_fits(census: Census, chosen: dict[str, Value]) -> Outcome:
    if not len(census):
        return invalid_outcome(_hw_key(chosen), "no valid plan on this hardware")
    return census.outcome(int(np.argmax(census.arrays["free_gib"])))


def _hw_key(chosen: dict[str, Value]) -> str:
    return "hardware: " + " ".join(f"{k}={v}" for k, v in sorted(chosen.items()))


@dataclasses.dataclass
class OuterLoop:
    """Asks hardware, settles each with its exact best plan (simulated when the backend is expensive), tells."""

    study: optuna.Study
    space: SearchSpace
    objectives: tuple[Objective, ...]
    catalog: HardwareCatalog
    cache: StudyCache
    executor: RayExecutor | None
    budget: int
    backend: str
    heartbeat: HeartbeatKeeper | None = None
    progress: bool = False  # a live bar (TTY) or a periodic status line on stderr

    def __post_init__(self) -> None:
        self.stats = LoopStats()
        self._memo: dict[str, Settled] = {}  # hardware candidate -> its best plan (the census is not rerun)

    def run(self) -> Answer:
        names = [d.name for d in self.space.hardware_dims]
        unit = "simulations" if self.executor is not None else "hardware candidates"
        try:
            with progress(self.budget, "co-design", unit=unit, enabled=self.progress) as bar:
                while self.cache.committed < self.budget and self.stats.asks < 20 * self.budget:
                    trial = self._ask()
                    chosen = self.space.complete({d.name: d.suggest(trial) for d in self.space.hardware_dims})
                    mark = " ".join(f"{n}={chosen[n]}" for n in names)
                    if mark not in self._memo:
                        self._memo[mark] = self._best(chosen)
                    self._settle(trial, chosen, *self._memo[mark])
                    bar.update(max(0, min(self.cache.committed, self.budget) - bar.n))
            full = self.cache.committed >= self.budget
            self.stats.stop_reason = "budget" if full else "ask cap reached (the hardware space repeats)"
        finally:
            if self.executor is not None:
                self.executor.close()
            self.stats.elapsed_s = time.perf_counter() - self.stats.started
        best = best_outcomes(self.cache.outcomes(), self.objectives, self.backend)
        line = (f"co-design: {len(self._memo):,} hardware candidates searched by Optuna, each with the exact best "
                f"plan of its census{' confirmed by ' + self.backend if self.executor is not None else ''}")
        return Answer(mode="outer", stats=self.stats, cache=self.cache, best=best, lines=[line])

    def _ask(self) -> optuna.trial.Trial:
        self.stats.asks += 1
        return ask_beaten(self.study, self.heartbeat)

    def _best(self, chosen: dict[str, Value]) -> Settled:
        try:
            return best_plan(self.space, self.catalog, chosen, self.objectives)
        except StageoptError as err:
            return invalid_outcome(_hw_key(chosen), str(err)), None

    def _settle(self, trial: optuna.trial.Trial, chosen: dict[str, Value], outcome: Outcome,
                choices: dict[str, Value] | None) -> None:
        """Claim the plan on the trial, then tell its result (simulated if need be), a repeat, or no budget."""
        valid = outcome.status != INVALID
        costly = valid and (choices is not None or self.executor is None)  # what costs a simulation
        decision = self.cache.claim([(trial, outcome.key, costly)], self.budget)[0] if valid else None
        self.stats.told += 1
        if decision is not None:
            self._untrack(trial)
            if decision == "budget":
                tell_unevaluated(self.study, trial, "not evaluated: the study's budget was reached by other workers")
                return
            self.stats.cached += 1
            known = self.cache.get(outcome.key).constraints() if outcome.key in self.cache else None
            tell_repeat(self.study, trial, outcome.key, int(decision), known)
            return
        if choices is not None and self.executor is not None:
            outcome = self._simulate(chosen, choices)
        self._untrack(trial)
        self.stats.invalid += outcome.status == INVALID
        self.stats.oom += outcome.status == OOM
        self.stats.failed += outcome.status == FAILED
        tell_outcome(self.study, trial, outcome, self.objectives, simulated=costly)
        if valid:
            self.cache.put(outcome, trial.number, simulated=costly)

    def _untrack(self, trial: optuna.trial.Trial) -> None:
        if self.heartbeat is not None:
            self.heartbeat.discard(trial._trial_id)

    def _simulate(self, chosen: dict[str, Value], choices: dict[str, Value]) -> Outcome:
        assert self.executor is not None
        sub = hardware_space(self.space, chosen)
        sub_catalog = HardwareCatalog(sub, reserve_gib=self.catalog.reserve_override)
        cand = make_candidate(sub, sub_catalog, choices)
        hw = sub_catalog.get(cand.hw_key)
        self.executor.submit(cand.key, cand, hw)
        (_, result), = self.executor.poll(wait_all=True)
        if isinstance(result, Estimate):
            return estimate_outcome(cand, result, hw.gpu.hbm_gib, sub_catalog.price(cand.hw_key), self.backend,
                                    sub_catalog.reserve(cand.hw_key))
        return failed_outcome(cand, result, self.backend)

