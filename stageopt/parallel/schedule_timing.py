"""Time a schedule's step orders with fixed pass durations: its makespan, bubble and peak memory.

Why: the papers state each schedule's bubble and activation memory in closed
form for pass times F, I (or B) and W; this small event model runs the very
step orders the traces encode, with those times and free messages, so tests
can hold the orders to the papers' formulas and the analytical model can use
the formulas with confidence. A pass starts when its stage's previous pass is
done and its input has arrived (the previous model stage's forward, the next
model stage's backward); a paired step and its partner start together and
both take ``fb`` (the time of an overlapped forward-and-backward pair).
"""

from __future__ import annotations

from dataclasses import dataclass

from stageopt.errors import StageoptError
from stageopt.parallel.placement import BIDIRECTIONAL, rank_chunks
from stageopt.parallel.steps import Step


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
    busy: list[float]  # per stage

    @property
    def bubble(self) -> float:
        """Idle time of the busiest stage: makespan minus its work."""
        return self.makespan - max(self.busy)


def time_orders(schedule: str, pp: int, vpp: int, m: int, orders: list[list[Step]], t: PassTimes) -> Timing:
    """Run every stage's order; raises if the orders deadlock."""
    n_model = pp if schedule in BIDIRECTIONAL else pp * vpp
    places = [rank_chunks(schedule, pp, vpp, s) for s in range(pp)]
    done: dict[tuple[str, int, int, int], float] = {}  # (kind, copy, model stage, mb) -> finish
    pos, clock, busy = [0] * pp, [0.0] * pp, [0.0] * pp

    def key(stage: int, step: Step, kind: str) -> tuple[str, int, int, int]:
        place = places[stage][step.chunk]
        return kind, place.copy, place.model_stage, step.microbatch

    def ready(stage: int, step: Step) -> float | None:
        place = places[stage][step.chunk]
        if step.kind == "F":
            need = None if place.model_stage == 0 else ("F", place.copy, place.model_stage - 1, step.microbatch)
        elif step.kind in ("B", "I"):
            last = place.model_stage == n_model - 1
            need = ("F" if last else "X", place.copy, place.model_stage + (0 if last else 1), step.microbatch)
        else:
            need = ("X", place.copy, place.model_stage, step.microbatch)
        if need is None:
            return 0.0
        return done.get(need)

    progress = True
    while progress:
        progress = False
        for s in range(pp):
            order = orders[s]
            while pos[s] < len(order):
                step = order[pos[s]]
                group = order[pos[s]:pos[s] + 2] if step.paired else [step]
                starts = [ready(s, g) for g in group]
                if any(x is None for x in starts):
                    break
                start = max([clock[s], *starts])
                length = (t.fb if t.fb is not None else sum(t.of(g.kind) for g in group)) if step.paired \
                    else t.of(step.kind)
                for g in group:
                    finish = start + length
                    done[key(s, g, g.kind)] = finish
                    if g.kind in ("B", "I"):
                        done[key(s, g, "X")] = finish  # the input gradient is out
                clock[s] = start + length
                busy[s] += length
                pos[s] += len(group)
                progress = True
    stuck = [s for s in range(pp) if pos[s] < len(orders[s])]
    if stuck:
        raise StageoptError(f"schedule {schedule}: stages {stuck} deadlock (pp={pp} vpp={vpp} m={m})")
    return Timing(makespan=max(clock), busy=busy)

