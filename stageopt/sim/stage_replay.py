"""Event replay of stage programs by symmetry: one representative rank per pipeline stage.

All ranks of a stage run the same program, and their collectives start and end
together, so a collective is a fixed-length busy period of a communication
slot. The engine follows ASTRA-sim's congestion-unaware rules — per rank one
compute slot and one communication slot (collectives and sends share it;
receives take none); whenever a node finishes, ready nodes are issued in
ascending id order, each if its slot is free; a receive completes when its
message (matched by sender stage, receiver stage and tag) has arrived — with
one deliberate difference: data-parallel collectives (gradient buckets, and
ZeRO-3/FSDP's per-layer parameter gathers, prefetched one block ahead, and
gradient scatters) run on a second, background communication slot, as
Megatron-LM and FSDP run them on their own CUDA streams. With ASTRA-sim's single slot a gradient bucket issued
during the last backward blocks every TP collective and pipeline send behind
it, and the delay cascades through all stages; ``stageopt replay`` (the
compatible mode) keeps that rule for bit-exact ASTRA-sim reproduction.
Host copies (activation offloading) run on a copy-engine slot of their own.
With ``a2a_rate`` below 1 (combined-1F1B plans, ``ep_overlap``), a kernel issued
while an expert all-to-all runs progresses at that rate until the all-to-all
ends: the two contend for SMs and HBM, and of each second overlapped only
``a2a_rate`` is saved (the analytical model's ``a2a_overlap_saving``, the same
figure). The slowdown is charged as exposed EP time. Likewise a kernel issued
while a background data-parallel collective runs progresses at ``dp_rate``
(the GPU's ``overlapped_rate``), the slowdown charged as exposed DP time.
Cost is O(nodes of one rank per stage) whatever the data-parallel size.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from stageopt.errors import SimulatorError
from stageopt.program.nodes import COLL, COMP, COPY, NEXT, RECV, SEND, StageProgram

BACKGROUND_PHASES = ("dp", "zero3")


# Order in which exposed time is attributed: a host copy first (the compute waits on it by dependency; a
# background gradient bucket may run meanwhile), then communication.
CATEGORIES = ("offload", "tp", "cp", "ep", "p2p", "dp")
COPY_SLOT = 3  # host copies (activation offloading) run on the copy engine, beside compute and communication
CONTENDERS = ("ep", "dp")  # collectives the kernels beside them slow down, by the category their slowdown is charged to


@dataclass(frozen=True)
class StageTiming:
    """When one stage's representative rank finished, and how its time was spent.

    ``compute_s + sum(exposed_s.values()) + idle_s == finish_s``: exposed time is
    communication or a host copy while the compute slot is idle, attributed to
    the first category of CATEGORIES that was busy; idle is waiting on pipeline
    neighbours.
    """

    finish_s: float
    compute_s: float
    exposed_s: dict[str, float]
    idle_s: float

    @property
    def comm_only_s(self) -> float:
        return sum(self.exposed_s.values())


def category(node) -> str:
    if node.type == COPY:
        return "offload"
    if node.type == SEND:
        return "p2p"
    group = node.group
    if group == "cpa":  # the all-to-all part of hierarchical CP is CP communication
        return "cp"
    return group if group in ("tp", "cp", "ep") else "dp"


def _busy_union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the (merged) intervals ``a`` not covered by the (merged) intervals ``b``."""
    out: list[tuple[float, float]] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def _measure(intervals: list[tuple[float, float]]) -> float:
    return sum(e - b for b, e in intervals)


class _Replay:
    """Mutable state of one replay: ready queues, busy slots, pending messages, busy spans."""

    def __init__(self, programs: list[StageProgram], durations: list[np.ndarray],
                 background: tuple[str, ...] = BACKGROUND_PHASES, a2a_rate: float = 1.0,
                 dp_rate: float = 1.0) -> None:
        self.p = len(programs)
        # per contending kind (index into CONTENDERS): the kernels' progress rate beside it, and per stage
        # when the collectives of that kind in flight end
        self.rates = (a2a_rate, dp_rate)
        self.contending = [kind for kind, rate in enumerate(self.rates) if rate < 1]
        self.contended_until = [[0.0, 0.0] for _ in range(self.p)]
        self.nodes = [prog.nodes for prog in programs]
        self.durations = durations
        self.waiting = [np.array([len(n.data_deps) + len(n.ctrl_deps) for n in ns], dtype=np.int64)
                        for ns in self.nodes]
        self.children: list[list[list[int]]] = []
        for ns in self.nodes:
            kids: list[list[int]] = [[] for _ in ns]
            for n in ns:
                for d in (*n.data_deps, *n.ctrl_deps):
                    kids[d].append(n.id)
            self.children.append(kids)
        self.slot_of = [[0 if n.type == COMP else COPY_SLOT if n.type == COPY else (2 if n.phase in background else 1)
                         for n in ns] for ns in self.nodes]
        self.contends = [[self._contender(n, slot) for n, slot in zip(ns, slots)]
                         for ns, slots in zip(self.nodes, self.slot_of)]
        self.ready: list[tuple[list[int], ...]] = [([], [], [], []) for _ in range(self.p)]
        self.busy = [[False, False, False, False] for _ in range(self.p)]
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, stage, node)
        self.seq = 0
        self.arrived: dict[tuple[int, int, int], float] = {}
        self.posted: dict[tuple[int, int, int], int] = {}
        self.spans: list[dict[str, list[tuple[float, float]]]] = [{} for _ in range(self.p)]
        self.done = [0] * self.p
        self.finish = [0.0] * self.p

    def peer(self, s: int, node) -> int:
        return (s + 1) % self.p if node.peer == NEXT else (s - 1) % self.p

    def schedule(self, t: float, s: int, i: int) -> None:
        heapq.heappush(self.events, (t, self.seq, s, i))
        self.seq += 1

    def make_ready(self, t: float, s: int, i: int) -> None:
        node = self.nodes[s][i]
        if node.type != RECV:
            heapq.heappush(self.ready[s][self.slot_of[s][i]], i)
            return
        key = (self.peer(s, node), s, node.tag)
        if key in self.arrived:
            self.schedule(max(t, self.arrived.pop(key)), s, i)
        else:
            self.posted[key] = i

    def issue(self, t: float, s: int) -> None:
        for slot in (1, 2, COPY_SLOT, 0):  # communication first: a kernel issued with it sees it in flight
            if not self.busy[s][slot] and self.ready[s][slot]:
                i = heapq.heappop(self.ready[s][slot])
                self.busy[s][slot] = True
                end = t + float(self.durations[s][i])
                if slot == 0:
                    self.spans[s].setdefault("compute", []).append((t, end))
                    extra, kind = self.contention(s, t, end - t) if self.contending else (0.0, 0)
                    if extra > 0:
                        self.spans[s].setdefault(CONTENDERS[kind], []).append((end, end + extra))
                        end += extra
                else:
                    kind = self.contends[s][i]
                    if kind >= 0:
                        self.contended_until[s][kind] = max(self.contended_until[s][kind], end)
                    self.spans[s].setdefault(category(self.nodes[s][i]), []).append((t, end))
                self.schedule(end, s, i)

    def _contender(self, node, slot: int) -> int:
        """Which kind of contention a node causes (an index into CONTENDERS), or -1."""
        if node.type != COLL:
            return -1
        if self.rates[0] < 1 and (node.collective, node.group) == ("all_to_all", "ep"):
            return 0
        return 1 if self.rates[1] < 1 and slot == 2 else -1

    def contention(self, s: int, t: float, d: float) -> tuple[float, int]:
        """Extra seconds a ``d``-second kernel issued at ``t`` runs beside the stage's contending collectives
        (the worst kind in flight), and that kind."""
        worst, which = 0.0, 0
        for kind in self.contending:
            under, rate = self.contended_until[s][kind] - t, self.rates[kind]
            if under > 0:
                extra = d / rate - d if d <= rate * under else (1 - rate) * under
                worst, which = max((worst, which), (extra, kind))
        return worst, which

    def complete(self, t: float, s: int, i: int) -> None:
        node = self.nodes[s][i]
        if node.type != RECV:
            self.busy[s][self.slot_of[s][i]] = False
        if node.type == SEND:
            key = (s, self.peer(s, node), node.tag)
            if key in self.posted:
                self.schedule(t, key[1], self.posted.pop(key))
            else:
                self.arrived[key] = t
        self.done[s] += 1
        self.finish[s] = max(self.finish[s], t)
        for c in self.children[s][i]:
            self.waiting[s][c] -= 1
            if self.waiting[s][c] == 0:
                self.make_ready(t, s, c)
        self.issue(t, s)

    def run(self) -> None:
        for s in range(self.p):
            for i in np.flatnonzero(self.waiting[s] == 0):
                self.make_ready(0.0, s, int(i))
            self.issue(0.0, s)
        while self.events:
            t, _, s, i = heapq.heappop(self.events)
            self.complete(t, s, i)
        for s in range(self.p):
            if self.done[s] != len(self.nodes[s]):
                stuck = next(n for n in self.nodes[s] if self.waiting[s][n.id] > 0 or n.id in self.posted.values())
                raise SimulatorError(f"replay: stage {s} deadlocked at node {stuck.id} ({stuck.name}); "
                                     "the program's sends and receives do not match")

    def timing(self, s: int) -> StageTiming:
        covered = _busy_union(self.spans[s].get("compute", []))
        compute = _measure(covered)
        exposed = {}
        for cat in CATEGORIES:
            alone = _subtract(_busy_union(self.spans[s].get(cat, [])), covered)
            exposed[cat] = _measure(alone)
            covered = _busy_union(covered + alone)
        return StageTiming(finish_s=self.finish[s], compute_s=compute, exposed_s=exposed,
                           idle_s=max(self.finish[s] - _measure(covered), 0.0))


def replay_stages(programs: list[StageProgram], durations: list[np.ndarray],
                  background: tuple[str, ...] = BACKGROUND_PHASES, a2a_rate: float = 1.0,
                  dp_rate: float = 1.0) -> list[StageTiming]:
    """Run every stage's program; ``durations[s][i]`` is node i's busy time in seconds.

    ``background``: phases whose collectives get the second communication
    slot; ``()`` is ASTRA-sim's one-slot rule. ``a2a_rate`` and ``dp_rate``: a
    kernel's progress rate beside an expert all-to-all and beside a background
    data-parallel collective (1: no contention).
    """
    replay = _Replay(programs, durations, background, a2a_rate, dp_rate)
    replay.run()
    return [replay.timing(s) for s in range(replay.p)]
