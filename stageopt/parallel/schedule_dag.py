"""A schedule's step orders as a dependency graph, timed level by level for many candidates at once.

Why: the analytical model prices thousands of plans; walking every step of
every order per plan in Python is too slow. The graph of a schedule shape
(schedule, pp, vpp, micro-batches) is built once: one node per step (an
overlapped DualPipe pair is one node), each waiting for the previous node of
its stage and for its input (the previous model stage's forward, the next
model stage's input gradient, its own I pass for a W). Nodes are grouped by
depth, so timing every candidate is one numpy maximum and add per level.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from stageopt.errors import StageoptError
from stageopt.parallel.placement import BIDIRECTIONAL, rank_chunks
from stageopt.parallel.steps import KINDS, Step

PAIR = len(KINDS)  # kind code of an overlapped pair node


@dataclass(frozen=True)
class ScheduleDag:
    """Nodes in creation order; ``-1`` in ``prev``/``deps`` means none (row N of the finish table is zeros)."""

    stage: np.ndarray
    chunk: np.ndarray
    kind: np.ndarray  # KINDS index, or PAIR
    chunk2: np.ndarray  # a pair's second (backward) chunk, else -1
    kind2: np.ndarray  # a pair's second kind code, else -1
    prev: np.ndarray
    deps: np.ndarray  # (nodes, 2)
    levels: tuple[np.ndarray, ...]
    pp: int

    @property
    def size(self) -> int:
        return len(self.stage)

    def finish_times(self, durations: np.ndarray, arrival: np.ndarray | None = None) -> np.ndarray:
        """Finish time of every node, shape (nodes + 1, candidates); durations: (nodes, candidates).

        ``arrival`` (nodes, candidates): seconds after a node ends that its output reaches a consumer on
        another stage (a message its own stage did not wait for); None: at once."""
        finish = np.zeros((self.size + 1, durations.shape[1]))
        late = None if arrival is None else self._edge_latency(arrival)
        for level in self.levels:
            first, second = finish[self.deps[level, 0]], finish[self.deps[level, 1]]
            if late is not None:
                first, second = first + late[level, 0], second + late[level, 1]
            finish[level] = np.maximum(np.maximum(finish[self.prev[level]], first), second) + durations[level]
        return finish

    def _edge_latency(self, arrival: np.ndarray) -> np.ndarray:
        """(nodes, 2, candidates): each input's ``arrival`` where it comes from another stage, else 0."""
        src = self.deps.clip(min=0)
        other = (self.deps >= 0) & (self.stage[src] != self.stage[:, None])
        return np.where(other[..., None], arrival[src], 0.0)

    def next_on_stage(self) -> np.ndarray:
        """The node its stage runs after each node (-1 for a stage's last)."""
        nxt = np.full(self.size, -1)
        has = self.prev >= 0
        nxt[self.prev[has]] = np.flatnonzero(has)
        return nxt

    def per_stage_sum(self, values: np.ndarray) -> np.ndarray:
        """Sum of per-node values over each stage's nodes, shape (pp, candidates)."""
        out = np.zeros((self.pp, values.shape[1]))
        np.add.at(out, self.stage, values)
        return out


@lru_cache(maxsize=128)
def compile_dag(schedule: str, pp: int, vpp: int, orders: tuple[tuple[Step, ...], ...]) -> ScheduleDag:
    """The graph of one schedule shape (``orders``: every stage's steps, see schedule.schedule_orders)."""
    n_model = pp if schedule in BIDIRECTIONAL else pp * vpp
    places = [rank_chunks(schedule, pp, vpp, s) for s in range(pp)]
    made: dict[tuple[str, int, int, int], int] = {}  # (kind, copy, model stage, mb) -> node
    rows: list[tuple[int, int, int, int, int, int, int, int]] = []
    last = [-1] * pp
    pos = [0] * pp

    def need(stage: int, step: Step) -> tuple[str, int, int, int] | None:
        place = places[stage][step.chunk]
        if step.kind == "F":
            return None if place.model_stage == 0 else ("F", place.copy, place.model_stage - 1, step.microbatch)
        if step.kind in ("B", "I"):
            end = place.model_stage == n_model - 1
            return ("F" if end else "X", place.copy, place.model_stage + (0 if end else 1), step.microbatch)
        return ("X", place.copy, place.model_stage, step.microbatch)

    progress = True
    while progress:
        progress = False
        for s in range(pp):
            order = orders[s]
            while pos[s] < len(order):
                step = order[pos[s]]
                group = order[pos[s]:pos[s] + 2] if step.paired else (step,)
                needs = [need(s, g) for g in group]
                if any(n is not None and n not in made for n in needs):
                    break
                deps = [made[n] for n in needs if n is not None] + [-1, -1]
                second = group[1] if len(group) == 2 else None
                rows.append((s, step.chunk, PAIR if second else KINDS.index(step.kind),
                             second.chunk if second else -1, KINDS.index(second.kind) if second else -1,
                             last[s], deps[0], deps[1]))
                node = len(rows) - 1
                for g in group:
                    place = places[s][g.chunk]
                    made[(g.kind, place.copy, place.model_stage, g.microbatch)] = node
                    if g.kind in ("B", "I"):
                        made[("X", place.copy, place.model_stage, g.microbatch)] = node
                last[s] = node
                pos[s] += len(group)
                progress = True
    stuck = [s for s in range(pp) if pos[s] < len(orders[s])]
    if stuck:
        raise StageoptError(f"schedule {schedule}: stages {stuck} deadlock (pp={pp} vpp={vpp})")
    table = np.array(rows, dtype=np.int64).reshape(-1, 8)
    depth = np.zeros(len(rows) + 1, dtype=np.int64)  # row -1 (the sentinel) has depth 0
    for i, (_s, _c, _k, _c2, _k2, prev, d0, d1) in enumerate(rows):
        depth[i] = 1 + max(depth[prev], depth[d0], depth[d1])
    node_depth = depth[:-1]
    order = np.argsort(node_depth, kind="stable")
    cuts = np.flatnonzero(np.diff(node_depth[order])) + 1
    levels = tuple(np.split(order, cuts))
    return ScheduleDag(stage=table[:, 0], chunk=table[:, 1], kind=table[:, 2], chunk2=table[:, 3],
                       kind2=table[:, 4], prev=table[:, 5], deps=table[:, 6:8], levels=levels, pp=pp)
