"""Spend an expensive backend's budget where it matters: confirm the census's best plans, learn the residual.

Why: with replay or ASTRA-sim a simulation costs seconds to minutes, while the
analytical census has already ranked every plan of the space. The budget counts
expensive simulations and goes, in order, to

1. ``--seed-plan`` plans;
2. the analytically best plans (20% of the budget), then a covering sample (up to
   30%): plans that hold every value of every searched dimension no chosen plan has
   yet, each time the analytically best of the plans that add the most such values
   (so a disagreement tied to one choice, say tp=8 or full recompute, is measured at
   least once, within the share, however low its best plan ranks), then plans at
   log-spaced analytical ranks (10%), so the model below sees the whole space;
3. then, batch by batch, the unsimulated plans with the lowest optimistic
   estimate under a :class:`~stageopt.search.residual.ResidualModel` fitted to
   ``log(t_backend / t_analytical)`` of everything simulated so far (a lower
   confidence bound, ``mean - KAPPA * std``), so a plan the analytical model ranks
   low but that the backend would find good is simulated, not missed.

``brute`` and ``grid`` simulate in plain analytical order, every feasible plan
if the budget allows. Before a plan is simulated it is claimed in the study on a trial of its own
(:mod:`stageopt.search.record`), so workers that ``--join`` one study never
simulate a plan twice and ``--budget`` counts the study's simulations; each
result is told as soon as its batch is back, so a killed search keeps what it
finished.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import optuna

from stageopt.console.progress import progress
from stageopt.search.cache import StudyCache, tell_outcome
from stageopt.search.candidate import Candidate, HardwareCatalog
from stageopt.search.census import Census, plan_fields
from stageopt.search.driver import LoopStats
from stageopt.search.executors import RayExecutor
from stageopt.search.objective import FAILED, OK, OOM, Objective, Outcome, estimate_outcome, failed_outcome
from stageopt.search.ranking import preferred_order, simplicity_columns
from stageopt.search.record import open_trial
from stageopt.search.residual import ResidualModel, plan_features
from stageopt.search.space import SearchSpace
from stageopt.search.workers import HeartbeatKeeper
from stageopt.sim.base import Estimate

TOP_SHARE = 0.2
COVER_SHARE = 0.3
SPREAD_SHARE = 0.1
KAPPA = 1.0


@dataclass(frozen=True)
class ConfirmConfig:
    budget: int
    backend: str
    seed: int = 0
    use_model: bool = True  # False: plain analytical order (brute / grid)
    progress: bool = False  # a live bar (TTY) or a periodic status line on stderr


class Confirmation:
    """Chooses, simulates and records plans of a census until the study's budget or the feasible plans run out."""

    def __init__(self, *, study: optuna.Study, space: SearchSpace, census: Census, objectives: tuple[Objective, ...],
                 catalog: HardwareCatalog, cache: StudyCache, executor: RayExecutor, config: ConfirmConfig,
                 heartbeat: HeartbeatKeeper | None = None) -> None:
        self.study, self.space, self.census, self.objectives = study, space, census, objectives
        self.catalog, self.cache, self.executor, self.config = catalog, cache, executor, config
        self.heartbeat = heartbeat
        self.stats = LoopStats()
        self.order = census.ranked_rows(objectives)  # feasible rows, analytically best first
        self._plans = {int(r): plan_fields(census.cands[int(r)]) for r in self.order}
        self._features = plan_features({k: v[self.order] for k, v in census.arrays.items()},
                                       [self._plans[int(r)] for r in self.order]) if self.order.size else None
        self._position = {int(r): i for i, r in enumerate(self.order)}

    @property
    def simulations(self) -> int:
        return len(self.cache.simulated)

    def run(self, seeds: list[tuple[dict, Candidate]] = ()) -> LoopStats:  # type: ignore[assignment]
        budget = self.config.budget
        total = min(budget, len(self.order) + len(seeds))
        try:
            with progress(total, f"{self.config.backend} simulations", unit="plans",
                          enabled=self.config.progress) as self.bar:
                self.bar.update(min(self.simulations, total))
                self._simulate([(ch, c) for ch, c in seeds if self.cache.taken(c.key) is None])
                initial = self._initial_rows()
                while self.cache.committed < budget:
                    batch = self._next(initial, min(self.executor.workers, budget - self.cache.committed))
                    if not batch:
                        self.stats.stop_reason = "every feasible plan simulated"
                        break
                    self._simulate([(self.census.choices_list[r], self.census.cands[r]) for r in batch])
                self.stats.stop_reason = self.stats.stop_reason or "budget"
        finally:
            self.executor.close()
            self.stats.elapsed_s = time.perf_counter() - self.stats.started
        return self.stats

    # ------------------------------------------------------------------ choosing

    def _untried(self, rows) -> list[int]:
        """Rows whose plan no worker holds, claims or failed on in this session."""
        return [int(r) for r in rows if self.cache.taken(self.census.cands[int(r)].key) is None]

    def _initial_rows(self) -> list[int]:
        """The analytically best plans, then the best plan of each uncovered value, then log-spaced ranks."""
        budget, order = self.config.budget, self.order
        if not self.config.use_model:
            return [int(r) for r in order]
        chosen = [int(r) for r in order[:math.ceil(TOP_SHARE * budget)]]
        dims = [d.name for d in self.space.plan_dims]
        covered = {(n, self.census.choices_list[r][n]) for r in chosen for n in dims}
        cover_cap = len(chosen) + math.ceil(COVER_SHARE * budget)
        values = [{(n, self.census.choices_list[int(r)][n]) for n in dims} for r in order]
        while len(chosen) < cover_cap:  # greedy cover: most new values first, the analytically better on ties
            gains = [len(v - covered) for v in values]
            best = int(np.argmax(gains))  # the first (best-ranked) row of the largest gain
            if gains[best] == 0:
                break
            chosen.append(int(order[best]))
            covered |= values[best]
        n_spread = math.ceil(SPREAD_SHARE * budget)
        rng = np.random.default_rng(self.config.seed)
        ranks = np.geomspace(1, max(len(order), 2), n_spread + 2)[1:-1] * rng.uniform(0.8, 1.0, n_spread)
        chosen += [int(order[i]) for i in np.unique(ranks.astype(int) - 1) if 0 <= i < len(order)]
        return list(dict.fromkeys(chosen))

    def _next(self, initial: list[int], size: int) -> list[int]:
        first = self._untried(initial)
        if first:
            return first[:size]
        if not self.config.use_model:
            return []
        untried = self._untried(self.order)
        if not untried:
            return []
        return self._by_model(untried, size)

    def _by_model(self, untried: list[int], size: int) -> list[int]:
        """Untried rows with the lowest optimistic time under the residual model (all objectives follow time)."""
        done = [(self._position[row], o) for o in self.cache.outcomes()
                if o.status == OK and o.record.get("backend") == self.config.backend
                and (row := self.census.row(o.key)) in self._position]
        ana_t = self.census.arrays["iteration_time_s"][self.order]
        pos = np.array([self._position[r] for r in untried])
        shift = np.zeros(len(pos))
        if len(done) >= 3:
            idx = np.array([i for i, _ in done])
            y = np.log([o.record["iteration_time_s"] for _, o in done]) - np.log(ana_t[idx])
            model = ResidualModel(self._features).fit(self._features[idx], y)
            mean, std = model.predict(self._features[pos])
            shift = mean - KAPPA * std
        ratio = np.exp(shift)  # optimistic backend time / analytical time
        rows = self.order[pos]
        values = self.census.objective_matrix(self.objectives, rows)
        for j, o in enumerate(self.objectives):
            scale = ratio if o.name in ("time", "cost") else 1.0 / ratio
            values[:, j] = values[:, j] * scale
        chosen = preferred_order(values, self.census.arrays["peak_memory_gib"][rows],
                                 simplicity_columns([self._plans[int(r)] for r in rows]),
                                 [self.census.cands[int(r)].key for r in rows])
        return [int(rows[i]) for i in chosen[:size]]

    # ------------------------------------------------------------------ simulating

    def _simulate(self, items: list[tuple[dict, Candidate]]) -> None:
        """Claim the plans (a trial each, opened only for plans nobody holds), simulate them, tell each."""
        if not items:
            return
        opened = self.cache.claim_new(
            [(c.key, lambda ch=ch: open_trial(self.study, self.space, ch, self.heartbeat)) for ch, c in items],
            self.config.budget)
        for (_, cand), trial in zip(items, opened):
            if trial is not None:
                self.executor.submit((trial, cand), cand, self.catalog.get(cand.hw_key))
        results = self.executor.poll(wait_all=True) if self.executor.in_flight else []
        results.sort(key=lambda r: r[0][0].number)  # reproducible order of the study's trials
        for (trial, cand), result in results:
            outcome = self._outcome(cand, result)
            if self.heartbeat is not None:
                self.heartbeat.discard(trial._trial_id)
            tell_outcome(self.study, trial, outcome, self.objectives, simulated=True)
            self.cache.put(outcome, trial.number, simulated=True)
            self.stats.told += 1
            self.stats.failed += outcome.status == FAILED
            self.stats.oom += outcome.status == OOM
        self.bar.update(len(results))

    def _outcome(self, cand: Candidate, result: Estimate | str) -> Outcome:
        if not isinstance(result, Estimate):
            return failed_outcome(cand, result, self.config.backend)
        hw = self.catalog.get(cand.hw_key)
        return estimate_outcome(cand, result, hw.gpu.hbm_gib, self.catalog.price(cand.hw_key), self.config.backend,
                                self.catalog.reserve(cand.hw_key))
