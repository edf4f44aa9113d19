"""Event replay of stage programs by symmetry: one representative rank per pipeline stage.

All ranks of a stage run the same program, and their collectives start and end
together, so a collective is a fixed-length busy period of a communication
slot. The engine follows ASTRA-sim's congestion-unaware rules — per rank one
compute slot and one communication slot (collectives and sends share it;
receives take none); whenever a node finishes, ready nodes are issued in
ascending id order, each if its slot is free; a receive completes when its
message (matched by sender stage, receiver stage and tag) has arrived — with
one deliberate difference: data-parallel gradient collectives run on a second,
background communication slot, as Megatron-LM runs them on their own CUDA
stream (ZeRO-3's gathers stay on the main slot: measured runs show no overlap). With ASTRA-sim's single slot a gradient bucket issued
during the last backward blocks every TP collective and pipeline send behind
it, and the delay cascades through all stages; ``stageopt replay`` (the
compatible mode) keeps that rule for bit-exact ASTRA-sim reproduction.
Cost is O(nodes of one rank per stage) whatever the data-parallel size.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from stageopt.errors import SimulatorError
from stageopt.program.nodes import COLL, COMP, NEXT, RECV, SEND, StageProgram

BACKGROUND_PHASES = ("dp",)


CATEGORIES = ("tp", "cp", "ep", "p2p", "dp")  # order in which exposed communication is attributed


@dataclass(frozen=True)
class StageTiming:
    """When one stage's representative rank finished, and how its time was spent.

    ``compute_s + sum(exposed_s.values()) + idle_s == finish_s``: exposed time is
    communication while the compute slot is idle, attributed to the first
    category of CATEGORIES that was busy; idle is waiting on pipeline neighbours.
    """

    finish_s: float
    compute_s: float
    exposed_s: dict[str, float]
    idle_s: float

    @property
    def comm_only_s(self) -> float:
        return sum(self.exposed_s.values())


def category(node) -> str:
    if node.type == SEND:
        return "p2p"
    group = node.group
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


def replay_stages(programs: list[StageProgram], durations: list[np.ndarray]) -> list[StageTiming]:
    """Run every stage's program; ``durations[s][i]`` is node i's busy time in seconds."""
    p = len(programs)
    nodes = [prog.nodes for prog in programs]
    waiting = [np.array([len(n.data_deps) + len(n.ctrl_deps) for n in ns], dtype=np.int64) for ns in nodes]
    children: list[list[list[int]]] = []
    for ns in nodes:
        kids: list[list[int]] = [[] for _ in ns]
        for n in ns:
            for d in (*n.data_deps, *n.ctrl_deps):
                kids[d].append(n.id)
        children.append(kids)
    slot_of = [[0 if n.type == COMP else (2 if n.phase in BACKGROUND_PHASES else 1) for n in ns] for ns in nodes]
    ready = [([], [], []) for _ in range(p)]  # heaps of node ids: compute, comm, background comm
    busy = [[False, False, False] for _ in range(p)]
    events: list[tuple[float, int, int, int]] = []  # (time, seq, stage, node)
    seq = 0
    arrived: dict[tuple[int, int, int], float] = {}
    posted: dict[tuple[int, int, int], int] = {}
    spans: list[dict[str, list[tuple[float, float]]]] = [{} for _ in range(p)]
    done = [0] * p
    finish = [0.0] * p

    def schedule(t: float, s: int, i: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, s, i))
        seq += 1

    def make_ready(t: float, s: int, i: int) -> None:
        node = nodes[s][i]
        if node.type == RECV:
            src = (s + 1) % p if node.peer == NEXT else (s - 1) % p
            key = (src, s, node.tag)
            if key in arrived:
                schedule(max(t, arrived.pop(key)), s, i)
            else:
                posted[key] = i
        else:
            heapq.heappush(ready[s][slot_of[s][i]], i)

    def issue(t: float, s: int) -> None:
        for slot in (0, 1, 2):
            if not busy[s][slot] and ready[s][slot]:
                i = heapq.heappop(ready[s][slot])
                busy[s][slot] = True
                end = t + float(durations[s][i])
                node = nodes[s][i]
                spans[s].setdefault("compute" if slot == 0 else category(node), []).append((t, end))
                schedule(end, s, i)

    for s in range(p):
        for i in np.flatnonzero(waiting[s] == 0):
            make_ready(0.0, s, int(i))
        issue(0.0, s)
    while events:
        t, _, s, i = heapq.heappop(events)
        node = nodes[s][i]
        if node.type != RECV:
            busy[s][slot_of[s][i]] = False
        if node.type == SEND:
            dst = (s + 1) % p if node.peer == NEXT else (s - 1) % p
            key = (s, dst, node.tag)
            if key in posted:
                schedule(t, dst, posted.pop(key))
            else:
                arrived[key] = t
        done[s] += 1
        finish[s] = max(finish[s], t)
        for c in children[s][i]:
            waiting[s][c] -= 1
            if waiting[s][c] == 0:
                make_ready(t, s, c)
        issue(t, s)
    for s in range(p):
        if done[s] != len(nodes[s]):
            stuck = next(n for n in nodes[s] if waiting[s][n.id] > 0 or n.id in posted.values())
            raise SimulatorError(f"replay: stage {s} deadlocked at node {stuck.id} ({stuck.name}); "
                                 "the program's sends and receives do not match")
    out = []
    for s in range(p):
        covered = _busy_union(spans[s].get("compute", []))
        compute = _measure(covered)
        exposed = {}
        for cat in CATEGORIES:
            alone = _subtract(_busy_union(spans[s].get(cat, [])), covered)
            exposed[cat] = _measure(alone)
            covered = _busy_union(covered + alone)
        out.append(StageTiming(finish_s=finish[s], compute_s=compute, exposed_s=exposed,
                               idle_s=max(finish[s] - _measure(covered), 0.0)))
    return out
