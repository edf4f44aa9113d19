"""Time a schedule's step orders with fixed pass durations: its makespan, bubble and peak memory.

Why: the papers state each schedule's bubble and activation memory in closed
form for pass times F, I (or B) and W; this small event model runs the very
step orders the traces encode, with those times and free messages, so tests
can hold the orders to the papers' formulas and the analytical model can use
the formulas with confidence. A pass starts when its stage's previous pass is
done and its input has arrived (the previous model stage's forward, the next
model stage's backward); a paired step and its partner start together and
both take ``fb`` (the time of an overlapped forward-and-backward pair). The
graph and its level-by-level timing are :mod:`stageopt.parallel.schedule_dag`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stageopt.parallel.schedule_dag import PAIR, compile_dag
from stageopt.parallel.steps import KINDS, Step


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Seconds (or any unit) of one pass of one chunk; ``fb`` is an overlapped F&B pair (default F + B)."""

    f: float
    i: float
    w: float
    fb: float | None = None

    @property
    def b(self) -> float:
        return self.i + self.w

    def of(self, kind: str) -> float:
        return {"F": self.f, "B": self.b, "I": self.i, "W": self.w}[kind]


@dataclass(frozen=True, slots=True)
class Timing:
    makespan: float
    busy: list[float]  # per stage: time the stage computes

    @property
    def bubble(self) -> float:
        """Idle time of the busiest stage: makespan minus its work."""
        return self.makespan - max(self.busy)


def time_orders(schedule: str, pp: int, vpp: int, m: int, orders: list[list[Step]], t: PassTimes) -> Timing:
    """Run every stage's order with the same pass times on every stage; raises if the orders deadlock."""
    dag = compile_dag(schedule, pp, vpp, tuple(tuple(o) for o in orders))
    single = np.array([t.of(k) for k in KINDS] + [0.0])
    durations = single[dag.kind]
    pairs = dag.kind == PAIR
    if pairs.any():  # a pair is a forward and a backward chunk
        durations[pairs] = t.fb if t.fb is not None else t.f + single[dag.kind2[pairs]]
    finish = dag.finish_times(durations[:, None])
    return Timing(makespan=float(finish.max()), busy=list(dag.per_stage_sum(durations[:, None])[:, 0]))
