"""The census: every valid canonical plan of a space, scored by the analytical model in vectorized passes.

Why first: the analytical model scores tens of thousands of plans per second, so
for an enumerable space the census *is* the answer under that model: the exact
optimum, the exact top-k and the exact Pareto front (``stageopt search`` with the
analytical backend returns them and samples nothing). For an expensive backend
it ranks every plan so the budget goes where it matters
(:mod:`stageopt.search.confirm`); for co-design it gives each hardware candidate
its best plan (:mod:`stageopt.search.outer`). It also lets the search refuse a
space with no feasible plan at once and say why. Spaces above ``MAX_ENUMERATE``
combinations are scored on a seeded random sample (``exhaustive`` is then False).

Scores are kept as arrays; :class:`~stageopt.search.objective.Outcome` records are
built only for the plans someone asks about (a 10^5-plan census stays fast).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stageopt.console.progress import progress as progress_bar
from stageopt.errors import ConfigError
from stageopt.search.candidate import Candidate, HardwareCatalog
from stageopt.search.census_grid import enumerate_space, flat_indices
from stageopt.search.dimensions import Value
from stageopt.search.objective import Objective, Outcome, estimate_outcome
from stageopt.search.ranking import first_of_equals, non_dominated, preferred_order, simplicity_columns
from stageopt.search.space import SearchSpace
from stageopt.sim.analytical import estimate_from_row
from stageopt.sim.analytical_batch import evaluate_plans

MAX_ENUMERATE = 2_000_000  # combinations scored exactly; larger spaces are sampled
SAMPLE = 200_000  # combinations scored when the space is larger
EVAL_CHUNK = 8192  # plans per vectorized call (progress granularity)
BREAKDOWN = ("t_compute", "t_tp", "t_cp", "t_ep", "t_p2p", "t_bubble", "t_dp", "t_optimizer", "t_offload")


@dataclass
class Census:
    """Scored candidates of a space (row i is ``cands[i]``) and how complete the list is."""

    space: SearchSpace
    catalog: HardwareCatalog
    combos: int
    exhaustive: bool
    cands: list[Candidate]
    choices_list: list[dict[str, Value]]
    invalid_reasons: Counter
    merged: int
    arrays: dict[str, np.ndarray]
    _rows: list[tuple[dict, int]] = field(repr=False, default_factory=list)  # (batch result, row in it)
    _outcomes: dict[int, Outcome] = field(repr=False, default_factory=dict)
    _index: dict[str, int] = field(repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {c.key: i for i, c in enumerate(self.cands)}

    # ------------------------------------------------------------------ lookups

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self.cands)

    @property
    def choices(self) -> dict[str, dict[str, Value]]:
        """Candidate key -> the first combination of dimension values that produces it."""
        return {c.key: ch for c, ch in zip(self.cands, self.choices_list)}

    def choices_of(self, key: str) -> dict[str, Value]:
        """The first combination of dimension values that produces candidate ``key``."""
        return self.choices_list[self._index[key]]

    def row(self, key: str) -> int | None:
        """The census row of candidate ``key`` (None when the census does not hold it)."""
        return self._index.get(key)

    @property
    def feasible_mask(self) -> np.ndarray:
        return self.arrays["free_gib"] >= 0

    @property
    def n_feasible(self) -> int:
        return int(self.feasible_mask.sum())

    def outcome(self, key_or_row: str | int) -> Outcome:
        """The analytical outcome of one candidate (built on first use)."""
        row = self._index[key_or_row] if isinstance(key_or_row, str) else int(key_or_row)
        if row not in self._outcomes:
            result, r = self._rows[row]
            cand = self.cands[row]
            hw = self.catalog.get(cand.hw_key)
            self._outcomes[row] = estimate_outcome(cand, estimate_from_row(result, r, hw), hw.gpu.hbm_gib,
                                                   self.catalog.price(cand.hw_key), "analytical",
                                                   self.catalog.reserve(cand.hw_key))
        return self._outcomes[row]

    @property
    def feasible(self) -> list[Outcome]:
        """Every feasible outcome (builds a record per plan: for checks, not for large censuses)."""
        return [self.outcome(int(i)) for i in np.flatnonzero(self.feasible_mask)]

    # ------------------------------------------------------------------ rankings

    def objective_matrix(self, objectives: Sequence[Objective], rows: np.ndarray) -> np.ndarray:
        """Objective values of ``rows``, signed so that every column is minimized."""
        cols = [self.arrays[o.field][rows] * (1.0 if o.direction == "minimize" else -1.0) for o in objectives]
        return np.stack(cols, axis=1) if cols else np.zeros((len(rows), 0))

    def ranked_rows(self, objectives: Sequence[Objective], feasible_only: bool = True) -> np.ndarray:
        """Rows best first: Pareto front first, then the first objective, then memory, then simplicity."""
        rows = np.flatnonzero(self.feasible_mask) if feasible_only else np.arange(len(self.cands))
        if rows.size == 0:
            return rows
        plans = [plan_fields(self.cands[i]) for i in rows]
        order = preferred_order(self.objective_matrix(objectives, rows), self.arrays["peak_memory_gib"][rows],
                                simplicity_columns(plans), [self.cands[i].key for i in rows])
        return rows[order]

    def ranked(self, objectives: Sequence[Objective], top: int | None = None) -> list[Outcome]:
        """Feasible outcomes best first (at most ``top``)."""
        return [self.outcome(int(i)) for i in self.ranked_rows(objectives)[:top]]

    def front(self, objectives: Sequence[Objective]) -> list[Outcome]:
        """The exact Pareto front (one best plan for a single objective), in preferred order."""
        rows = self.ranked_rows(objectives)
        if rows.size == 0:
            return []
        if len(objectives) == 1:
            return [self.outcome(int(rows[0]))]
        values = self.objective_matrix(objectives, rows)
        front = rows[non_dominated(values)]
        front = front[first_of_equals(self.objective_matrix(objectives, front))]
        return [self.outcome(int(i)) for i in front]


def plan_fields(cand: Candidate) -> dict:
    """The plan fields rankings and models read, as a plain dict."""
    p = cand.plan
    return {"tp": p.tp, "cp": p.cp, "pp": p.pp, "ep": p.ep, "vpp": p.vpp, "dp": p.dp, "zero": p.zero,
            "recompute": p.recompute, "schedule": p.schedule, "mbs": p.mbs, "gbs": p.gbs,
            "uneven": bool(p.first_layers or p.last_layers or p.embed_split or p.loss_split or p.layout)}


def take_census(space: SearchSpace, catalog: HardwareCatalog, seed: int = 0, progress: bool = False) -> Census:
    """Enumerate (or sample) the space, keep valid canonical candidates, score them analytically."""
    if not space.enumerable:
        raise ConfigError(f"space {space.name}: continuous hardware ranges cannot be enumerated; "
                          "the census covers the plan part per hardware candidate")
    total = space.size()
    exhaustive = total <= MAX_ENUMERATE
    sample, count = flat_indices(total, MAX_ENUMERATE if exhaustive else SAMPLE, seed)
    with progress_bar(count, "census: enumerate", unit="combinations", enabled=progress) as bar:
        found = enumerate_space(space, catalog, sample, count, bar)
    arrays, rows = _score(found.cands, catalog, progress)
    return Census(space=space, catalog=catalog, combos=total, exhaustive=exhaustive, cands=found.cands,
                  choices_list=found.choices, invalid_reasons=found.invalid_reasons, merged=found.merged,
                  arrays=arrays, _rows=rows)


def _score(cands: list[Candidate], catalog: HardwareCatalog,
           progress: bool) -> tuple[dict[str, np.ndarray], list[tuple[dict, int]]]:
    """Vectorized analytical scores per (hardware, model) group, in chunks, back in candidate order."""
    n = len(cands)
    names = ("iteration_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "hbm_gib", "reserve_gib",
             "usd_per_gpu_hour", "gpus", *BREAKDOWN)
    arrays = {k: np.zeros(n) for k in names}
    rows: list[tuple[dict, int]] = [({}, 0)] * n
    groups: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cands):
        groups.setdefault((c.hw_key, c.model.seq), []).append(i)
    with progress_bar(n, "census: score", unit="plans", enabled=progress) as bar:
        for (hw_key, _), index in groups.items():
            hw = catalog.get(hw_key)
            for start in range(0, len(index), EVAL_CHUNK):
                part = index[start:start + EVAL_CHUNK]
                result = evaluate_plans(cands[part[0]].model, hw, [cands[i].plan for i in part])
                idx = np.asarray(part)
                for key, src in (("iteration_time_s", "iteration_time_s"), ("tokens_per_s", "tokens_per_s"),
                                 ("mfu", "mfu"), ("peak_memory_gib", "mem_total"), *((k, k) for k in BREAKDOWN)):
                    arrays[key][idx] = result[src]
                arrays["hbm_gib"][idx] = hw.gpu.hbm_gib
                arrays["reserve_gib"][idx] = catalog.reserve(hw_key)
                arrays["usd_per_gpu_hour"][idx] = catalog.price(hw_key)
                arrays["gpus"][idx] = [cands[i].gpus for i in part]
                for r, i in enumerate(part):
                    rows[i] = (result, r)
                bar.update(len(part))
    arrays["free_gib"] = arrays["hbm_gib"] - arrays["reserve_gib"] - arrays["peak_memory_gib"]
    arrays["usd_per_mtok"] = arrays["gpus"] * arrays["usd_per_gpu_hour"] / 3600.0 / np.maximum(
        arrays["tokens_per_s"], 1e-300) * 1e6
    return arrays, rows


def require_feasible(census: Census, space: SearchSpace) -> None:
    """Raise a one-line ConfigError saying why no plan of the space can run."""
    if census.n_feasible:
        return
    scope = "" if census.exhaustive else f" (in a sample of {SAMPLE:,} combinations)"
    if not len(census):
        rule, count = census.invalid_reasons.most_common(1)[0] if census.invalid_reasons else ("?", 0)
        raise ConfigError(f"space {space.name}: no valid plan{scope}: all {census.combos:,} combinations break a "
                          f"rule, most often '{rule}' ({count:,}); widen plan choices or change gpus/global_batch")
    rec = census.outcome(int(np.argmax(census.arrays["free_gib"]))).record
    raise ConfigError(f"space {space.name}: no plan fits {rec['hbm_gib']:g} GiB with a {rec['reserve_gib']:.1f} GiB "
                      f"reserve{scope}: smallest needs {rec['peak_memory_gib']:.0f} GiB at {rec['plan']} on "
                      f"{rec['hardware']}; allow larger tp/pp/cp, zero or recompute=full, more GPUs/HBM, "
                      "or a smaller --reserve-gib")
