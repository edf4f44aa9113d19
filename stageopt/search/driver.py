"""The search loop: ask Optuna for candidates, settle the cheap ones at once, simulate the rest, tell.

Per asked trial, in order of cost:

1. choices that cannot form a plan (divisibility) are told with a penalty and
   the ``valid`` constraint violated (no estimate exists);
2. a candidate already in the cache is told the cached result (free);
3. the analytical screen (vectorized over the batch) gives memory; a plan that
   does not fit is told with its analytical estimate and ``memory_gib`` > 0;
4. a feasible plan is the analytical result itself (analytical backend) or is
   sent to the executor (replay, ASTRA-sim), and told when it comes back.

Only simulations count against the budget: every new valid candidate with the
analytical backend (its evaluation is the simulation, memory overflow included),
and the feasible ones sent to an expensive backend otherwise. Every trial is told
as soon as its result exists, so a killed search loses only what was in flight.
With a seed, work proceeds in synchronous batches (reproducible); without one,
Ray workers are refilled as soon as one frees.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import optuna

from stageopt.errors import StageoptError
from stageopt.search.cache import StudyCache, tell_outcome, tell_repeat, tell_unevaluated
from stageopt.search.candidate import Candidate, HardwareCatalog, make_candidate
from stageopt.search.census import Census
from stageopt.search.dimensions import Value
from stageopt.search.executors import RayExecutor, analytical_estimates
from stageopt.search.objective import FAILED, OK, Objective, Outcome, estimate_outcome, failed_outcome, invalid_outcome
from stageopt.search.ranking import (
    first_of_equals,
    non_dominated,
    plan_fields_of_text,
    preferred_order,
    simplicity_columns,
)
from stageopt.search.refine import neighbours
from stageopt.search.space import SearchSpace, encode_choices
from stageopt.search.workers import HeartbeatKeeper, ask_beaten
from stageopt.sim.base import Estimate


@dataclass(frozen=True, slots=True)
class LoopConfig:
    budget: int
    max_asks: int
    batch: int
    backend: str
    refine: bool = False  # enqueue untried neighbours of the incumbents (see stageopt.search.refine)
    refine_after: float = 0.25  # fraction of the budget sampled before refinement starts
    refine_top: int = 32  # incumbents (best first) whose neighbourhoods may be searched


@dataclass
class LoopStats:
    asks: int = 0
    told: int = 0
    cached: int = 0
    invalid: int = 0
    oom: int = 0
    failed: int = 0
    stop_reason: str = ""
    elapsed_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)


ProgressFn = Callable[["SearchLoop"], None]


class SearchLoop:
    """Runs one search session against an open study; the study's storage keeps everything told."""

    def __init__(self, *, study: optuna.Study, space: SearchSpace, objectives: tuple[Objective, ...],
                 catalog: HardwareCatalog, cache: StudyCache, census: Census | None, config: LoopConfig,
                 executor: RayExecutor | None = None, sync: Callable[[], None] | None = None,
                 heartbeat: HeartbeatKeeper | None = None, synchronous: bool = True,
                 progress: ProgressFn | None = None) -> None:
        self.study, self.space, self.objectives = study, space, objectives
        self.catalog, self.cache, self.census, self.config = catalog, cache, census, config
        self.executor, self.synchronous = executor, synchronous
        self._flush, self.heartbeat = sync, heartbeat
        self.progress = progress
        self.stats = LoopStats()
        self._in_flight: dict[str, Candidate] = {}
        self._choices: dict[str, dict[str, Value]] = {}  # candidate key -> choices that produced it
        self._proposed: set[str] = set()  # keys enqueued by refinement
        self._exhausted = False
        self.target = config.budget
        if census is not None and census.exhaustive:  # stop when the space has nothing new to simulate
            self.target = min(config.budget, len(census) if executor is None else census.n_feasible)

    # ------------------------------------------------------------------ the loop

    @property
    def simulations(self) -> int:
        return len(self.cache.simulated)

    def run(self) -> LoopStats:
        try:
            while True:
                reason = self._stop_reason()
                if reason:
                    self.stats.stop_reason = reason
                    break
                room = self._room()
                if room > 0:
                    self._refine(room - room // 4)
                    cached_before = self.stats.cached
                    self._step([self._ask() for _ in range(room)])
                    if self.stats.cached - cached_before > room // 2:
                        self._explore(room)
                if self.executor is not None and self.executor.in_flight:
                    self._collect(wait_all=self.synchronous)
                self._sync()
                if self.progress:
                    self.progress(self)
            while self.executor is not None and self.executor.in_flight:
                self._collect(wait_all=True)
        finally:
            self._sync()
            if self.executor is not None:
                self.executor.close()
            self.stats.elapsed_s = time.perf_counter() - self.stats.started
        return self.stats

    def _stop_reason(self) -> str:
        if self.simulations >= self.target or (self.cache.committed >= self.target and not self._in_flight):
            return "budget" if self.target == self.config.budget else "every candidate simulated"
        if self._exhausted:
            return "sampler exhausted the space"
        if self.stats.asks >= self.config.max_asks and not self._in_flight:
            return f"ask cap ({self.config.max_asks}) reached"
        return ""

    def _room(self) -> int:
        """How many trials to ask now: a batch in-process; free workers' worth with Ray."""
        left_budget = self.target - self.cache.committed  # every worker's simulations, done or under way
        left_asks = self.config.max_asks - self.stats.asks
        if left_budget <= 0 or left_asks <= 0:
            return 0
        if self.executor is None:
            return min(self.config.batch, left_asks, left_budget)
        if self.synchronous and self.executor.in_flight:
            return 0
        free = self.executor.workers - self.executor.in_flight
        return max(0, min(free, left_budget, left_asks))

    def _refine(self, limit: int) -> None:
        """Enqueue up to ``limit`` untried valid neighbours of the best candidates, best first."""
        if not self.config.refine or self.simulations < self.config.refine_after * self.target:
            return
        ranked = ranked_outcomes(self.cache.outcomes(), self.objectives, self.config.backend)
        queued = 0
        for outcome in ranked[:self.config.refine_top]:
            base = self._choices.get(outcome.key)
            if base is None:
                continue
            for choices in neighbours(self.space, base):
                try:
                    cand = make_candidate(self.space, self.catalog, choices)
                except StageoptError:
                    continue
                if cand.key in self.cache or cand.key in self._proposed or cand.key in self._in_flight:
                    continue
                self._proposed.add(cand.key)
                self.study.enqueue_trial(encode_choices(self.space, choices), skip_if_exists=False)
                queued += 1
                if queued >= limit:
                    return

    def _explore(self, limit: int) -> None:
        """The sampler mostly repeats itself: enqueue untried valid plans of the space, at random.

        Only when the census enumerated the whole space (so "untried" is known); the
        draw is seeded by the number of simulations so a seeded search stays reproducible.
        """
        if not self.config.refine or self.census is None or not self.census.exhaustive:
            return
        census = self.census
        untried = [i for i, c in enumerate(census.cands)
                   if c.key not in self.cache and c.key not in self._proposed and c.key not in self._in_flight]
        rng = np.random.default_rng(self.simulations)
        for i in rng.permutation(len(untried))[:limit]:
            row = untried[int(i)]
            self._proposed.add(census.cands[row].key)
            self.study.enqueue_trial(encode_choices(self.space, census.choices_list[row]), skip_if_exists=False)

    def _ask(self) -> optuna.trial.Trial:
        self.stats.asks += 1
        return ask_beaten(self.study, self.heartbeat)

    def _step(self, trials: list[optuna.trial.Trial]) -> None:
        """Screen the batch in one vectorized call, claim its plans in the study, then tell or dispatch each."""
        fresh: list[tuple[optuna.trial.Trial, Candidate]] = []
        for trial in trials:
            try:
                values = self.space.suggest(trial)
                cand = make_candidate(self.space, self.catalog, values)
            except StageoptError as err:
                key = "invalid: " + " ".join(f"{k}={v}" for k, v in sorted(trial.params.items()))
                self._tell(trial, invalid_outcome(key, str(err).removeprefix("plan: ")), simulated=False)
                continue
            self._choices.setdefault(cand.key, values)
            fresh.append((trial, cand))
        if not fresh:
            return
        outcomes = self._screen([c for _, c in fresh])
        costly = [self.executor is None or o.status == OK for o in outcomes]  # what a simulation will be spent on
        decisions = self.cache.claim([(t, c.key, k) for (t, c), k in zip(fresh, costly)], self.target)
        for (trial, cand), outcome, decision in zip(fresh, outcomes, decisions):
            if decision == "budget":
                self._untrack(trial)
                tell_unevaluated(self.study, trial, "not simulated: the study's budget was reached by other workers")
            elif decision is not None:
                self._repeat(trial, cand.key, int(decision))
            elif outcome.status != OK or self.executor is None:
                self._tell(trial, outcome, simulated=self.executor is None)  # the analytical evaluation is the simulation
            else:
                self._in_flight[cand.key] = cand
                self.executor.submit((trial, cand), cand, self.catalog.get(cand.hw_key))

    def _screen(self, cands: list[Candidate]) -> list[Outcome]:
        """Analytical outcomes: from the census when it has them (already computed in one vectorized
        pass), otherwise one vectorized call for the batch."""
        census = self.census
        todo = [c for c in cands if census is None or c.key not in census]
        fresh = {c.key: self._outcome(c, est, "analytical")
                 for c, est in zip(todo, analytical_estimates(self.catalog, todo))} if todo else {}
        return [fresh[c.key] if c.key in fresh else census.outcome(c.key) for c in cands]  # type: ignore[union-attr]

    def _collect(self, wait_all: bool) -> None:
        assert self.executor is not None
        results = self.executor.poll(wait_all=wait_all)
        if self.synchronous:
            results.sort(key=lambda r: r[0][0].number)
        for (trial, cand), result in results:
            self._in_flight.pop(cand.key, None)
            if isinstance(result, Estimate):
                outcome = self._outcome(cand, result, self.config.backend)
            else:
                outcome = failed_outcome(cand, result, self.config.backend)
            self._tell(trial, outcome, simulated=True)

    def _outcome(self, cand: Candidate, est: Estimate, backend: str) -> Outcome:
        hw = self.catalog.get(cand.hw_key)
        return estimate_outcome(cand, est, hw.gpu.hbm_gib, self.catalog.price(cand.hw_key), backend,
                                self.catalog.reserve(cand.hw_key))

    # ------------------------------------------------------------------ telling

    def _tell(self, trial: optuna.trial.Trial, outcome: Outcome, *, simulated: bool) -> None:
        self._untrack(trial)
        stats = self.stats
        stats.told += 1
        stats.invalid += outcome.status == "invalid"
        stats.oom += outcome.status == "oom"
        stats.failed += outcome.status == FAILED
        try:
            tell_outcome(self.study, trial, outcome, self.objectives, simulated=simulated)
        except RuntimeError as err:
            if "Study.stop" not in str(err):
                raise
            self._exhausted = True  # grid / brute-force samplers signal a finished space this way
        if outcome.status != "invalid":
            self.cache.put(outcome, trial.number, simulated=simulated)

    def _repeat(self, trial: optuna.trial.Trial, key: str, holder: int) -> None:
        """A plan the study already holds (or is simulating): PRUNED, pointing at its holder; costs nothing."""
        self._untrack(trial)
        self.stats.told += 1
        self.stats.cached += 1
        known = self.cache.get(key).constraints() if key in self.cache else None
        try:
            tell_repeat(self.study, trial, key, holder, known)
        except RuntimeError as err:
            if "Study.stop" not in str(err):
                raise
            self._exhausted = True

    def _untrack(self, trial: optuna.trial.Trial) -> None:
        if self.heartbeat is not None:
            self.heartbeat.discard(trial._trial_id)

    def _sync(self) -> None:
        if self._flush is not None:
            self._flush()

    # ------------------------------------------------------------------ views

    def best(self) -> list[Outcome]:
        """Best feasible result(s) of the backend: one for a single objective, the Pareto front otherwise."""
        return best_outcomes(self.cache.outcomes(), self.objectives, self.config.backend)


def ranked_outcomes(outcomes: list[Outcome], objectives: tuple[Objective, ...], backend: str) -> list[Outcome]:
    """Feasible results of the backend, best first: Pareto front, first objective, lower memory, simpler plan."""
    feas = list({o.key: o for o in outcomes if o.status == OK and o.record.get("backend") == backend}.values())
    if not feas:
        return []
    signs = np.array([1.0 if o.direction == "minimize" else -1.0 for o in objectives])
    values = np.array([o.values(objectives) for o in feas]).reshape(len(feas), len(objectives)) * signs
    order = preferred_order(values, np.array([o.record["peak_memory_gib"] for o in feas]),
                            simplicity_columns([plan_fields_of_text(o.record["plan"]) for o in feas]),
                            [o.key for o in feas])
    return [feas[i] for i in order]


def best_outcomes(outcomes: list[Outcome], objectives: tuple[Objective, ...], backend: str) -> list[Outcome]:
    """The best result (one objective) or the Pareto front (several), in preferred order."""
    ranked = ranked_outcomes(outcomes, objectives, backend)
    if len(objectives) == 1 or not ranked:
        return ranked[:1]
    signs = np.array([1.0 if o.direction == "minimize" else -1.0 for o in objectives])
    values = np.array([o.values(objectives) for o in ranked]) * signs
    front = [i for i in np.flatnonzero(non_dominated(values))]
    keep = first_of_equals(values[front])
    return [ranked[i] for i, k in zip(front, keep) if k]
