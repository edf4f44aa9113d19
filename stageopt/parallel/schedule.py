"""Pipeline schedules: the order of work on each stage.

Each schedule lists, per pipeline stage, steps ``(micro-batch, chunk, F|B)``.
That order is what the trace generator encodes as control dependencies and
what the memory model walks to find how many micro-batches are in flight.
Interleaved 1F1B follows Megatron-LM's order (Narayanan et al. 2021, sec. 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from stageopt.parallel.plan import Plan


@dataclass(frozen=True, slots=True)
class Step:
    microbatch: int
    chunk: int  # local model chunk on this stage (0 .. vpp-1)
    kind: str  # "F" or "B"


def stage_order(plan: Plan, stage: int) -> list[Step]:
    """The ordered steps pipeline stage ``stage`` runs in one iteration."""
    p, m, v = plan.pp, plan.microbatches, plan.vpp
    if plan.schedule == "gpipe":
        return [Step(i, 0, "F") for i in range(m)] + [Step(i, 0, "B") for i in range(m)]
    if plan.schedule == "1f1b" or v == 1:
        warmup = min(p - stage - 1, m)
        steps = [Step(i, 0, "F") for i in range(warmup)]
        for i in range(m - warmup):
            steps += [Step(warmup + i, 0, "F"), Step(i, 0, "B")]
        steps += [Step(i, 0, "B") for i in range(m - warmup, m)]
        return steps
    return _interleaved(p, m, v, stage)


def _interleaved(p: int, m: int, v: int, stage: int) -> list[Step]:
    total = m * v

    def forward(k: int) -> Step:
        return Step((k // (p * v)) * p + k % p, (k // p) % v, "F")

    def backward(k: int) -> Step:
        return Step((k // (p * v)) * p + k % p, v - 1 - (k // p) % v, "B")

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    steps = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [forward(warmup + k), backward(k)]
    steps += [backward(k) for k in range(total - warmup, total)]
    return steps


def peak_in_flight(order: list[Step], weight: dict[int, float]) -> float:
    """Largest sum of ``weight[chunk]`` over forward steps whose backward has not run yet."""
    held = peak = 0.0
    for step in order:
        held += weight[step.chunk] if step.kind == "F" else -weight[step.chunk]
        peak = max(peak, held)
    return peak


def max_in_flight(order: list[Step], chunk: int) -> int:
    """Most micro-batches of one chunk held at once."""
    return int(peak_in_flight(order, {c: float(c == chunk) for c in {s.chunk for s in order}}))


def virtual_stage(plan: Plan, stage: int, chunk: int) -> int:
    """Position of a stage's local chunk in the model (Megatron's chunk assignment)."""
    return chunk * plan.pp + stage
