"""Pipeline schedules: the order of work on each stage.

Each schedule lists, per pipeline stage, steps ``(micro-batch, chunk, kind)``.
That order is what the trace generator encodes as control dependencies and
what the memory model walks to find how many micro-batches are in flight.
Kinds: ``F`` forward, ``B`` full backward, and for zero-bubble schedules the
backward split in two: ``I`` (input gradient, on the critical path) and ``W``
(weight gradient, deferrable; Qi et al. 2023). A step with ``paired`` set runs
overlapped with the step after it (DualPipe's forward-and-backward chunk pair,
which hides one chunk's communication behind the other's compute).

* GPipe; 1F1B; interleaved 1F1B in Megatron-LM's order (Narayanan et al. 2021, sec. 2.2).
* ``zbh1``: ZB-H1 (Qi et al. 2023, sec. 2.1): 1F1B's forwards and input
  gradients, stage ``s`` keeping up to ``s`` weight-gradient passes pending so
  that every stage holds at most 1F1B's activation memory.
* ``zb2p``: ZB-2p (Qi et al. 2024, sec. 3.1): the paper's scheduling rules under a
  2p-micro-batch activation limit, found once on equal pass times; its stages end in
  the order they start, so a stack that overlaps iterations (optimizer
  post-validation) runs it with next to no bubble.
* ``zbv``: ZB-V (Qi et al. 2024), two chunks per rank in a V, zero bubble when
  F, I and W take equal time, 1F1B's peak activation memory.
* ``dualpipe`` / ``dualpipev``: DeepSeek-V3's bidirectional DualPipe (two model
  copies, micro-batches fed from both ends) and its one-copy V variant, in the
  eight phases of the DualPipe reference implementation.
"""

from __future__ import annotations


from functools import lru_cache

from stageopt.parallel.placement import BIDIRECTIONAL, rank_chunks
from stageopt.parallel.plan import Plan
from stageopt.parallel.schedule_dualpipe import dualpipe_order
from stageopt.parallel.schedule_zb import zbh1_order, zb2p_order, zbv_order
from stageopt.parallel.steps import Step

__all__ = ["Step", "stage_order", "schedule_orders", "peak_in_flight", "max_in_flight", "virtual_stage", "microbatch_copy"]


def stage_order(plan: Plan, stage: int) -> list[Step]:
    """The ordered steps pipeline stage ``stage`` runs in one iteration."""
    return list(schedule_orders(plan.schedule, plan.pp, plan.vpp, plan.microbatches, plan.ep_overlap,
                                plan.microbatch_group)[stage])


@lru_cache(maxsize=256)
def schedule_orders(schedule: str, p: int, v: int, m: int, combined: bool = False,
                    group: int = 0) -> tuple[tuple[Step, ...], ...]:
    """Every stage's order for a schedule shape (cached: the analytical model asks for the same shapes often).

    ``combined`` (the plan's ``ep_overlap``): 1F1B's steady-state forward runs paired with the backward
    after it (Megatron-Core's combined 1F1B). Each stage runs one more warmup forward than 1F1B, so
    that every merged forward has a backward of another micro-batch to pair with (without a pipeline:
    F0, then F1 with B0, F2 with B1, ...). ``group``: micro-batches the interleaved schedule runs
    through one chunk in a row (the plan's ``vpp_group``; 0: ``p``).
    """
    orders = tuple(tuple(_order(schedule, p, v, m, stage, combined, group or p)) for stage in range(p))
    return tuple(tuple(_paired(order)) for order in orders) if combined else orders


def _paired(order: tuple[Step, ...]) -> list[Step]:
    """Mark every forward followed by a backward of another micro-batch or chunk as overlapped with it."""
    out = list(order)
    for i in range(len(out) - 1):
        f, b = out[i], out[i + 1]
        if f.kind == "F" and b.kind == "B" and (f.microbatch, f.chunk) != (b.microbatch, b.chunk):
            out[i] = Step(f.microbatch, f.chunk, "F", True)
    return out


def _order(schedule: str, p: int, v: int, m: int, stage: int, combined: bool = False, group: int = 0) -> list[Step]:
    if schedule == "gpipe":
        return [Step(i, 0, "F") for i in range(m)] + [Step(i, 0, "B") for i in range(m)]
    if schedule == "zbh1":
        return zbh1_order(p, m, stage)
    if schedule == "zb2p":
        return zb2p_order(p, m, stage)
    if schedule == "zbv":
        return zbv_order(p, m, stage)
    if schedule in ("dualpipe", "dualpipev"):
        return dualpipe_order(p, m, stage, bidirectional=schedule == "dualpipe")
    if schedule == "1f1b" or v == 1:
        warmup = min(p - stage - 1 + int(combined), m)
        steps = [Step(i, 0, "F") for i in range(warmup)]
        for i in range(m - warmup):
            steps += [Step(warmup + i, 0, "F"), Step(i, 0, "B")]
        steps += [Step(i, 0, "B") for i in range(m - warmup, m)]
        return steps
    return _interleaved(p, m, v, stage, combined, group)


def interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward, in order: ``group`` micro-batches through chunk 0, the same through
    chunk 1, ..., then the next group; a last group of fewer micro-batches runs them all (Megatron-Core's
    schedule table; backward k runs the same micro-batch through the mirrored chunk)."""
    table = []
    for first in range(0, m, group):
        members = range(first, m if first + group >= m else first + group)
        table += [(mb, chunk) for chunk in range(v) for mb in members]
    return table


def _interleaved(p: int, m: int, v: int, stage: int, combined: bool = False, group: int = 0) -> list[Step]:
    total, group = m * v, group or p
    table = interleaved_table(m, v, group)

    def forward(k: int) -> Step:
        return Step(table[k][0], table[k][1], "F")

    def backward(k: int) -> Step:
        return Step(table[k][0], v - 1 - table[k][1], "B")

    warmup = min((p - stage - 1) * 2 + (v - 1) * group + int(combined), total)
    steps = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [forward(warmup + k), backward(k)]
    steps += [backward(k) for k in range(total - warmup, total)]
    return steps


def activation_deltas(kind: str, full: float, held: float) -> float:
    """Change of held activation bytes when a step of ``kind`` runs on a chunk.

    ``full``: bytes a forward saves for backward; ``held``: bytes the deferred
    weight-gradient pass still needs after the input-gradient pass (its saved
    inputs plus the output gradients it reads).
    """
    return {"F": full, "B": -full, "I": held - full, "W": -held}[kind]


def peak_in_flight(order: list[Step], weight: dict[int, float], held: dict[int, float] | None = None,
                   merge_pairs: bool = False) -> float:
    """Largest activation bytes held over the order (``weight[chunk]`` per forward, see activation_deltas).

    ``merge_pairs``: a paired forward and backward change the bytes together (combined 1F1B runs them
    layer by layer, the backward freeing a layer as the forward saves one), so the peak never sees
    the forward's bytes before the backward's are freed.
    """
    held = held or {}
    now = peak = 0.0
    for step in order:
        now += activation_deltas(step.kind, weight[step.chunk], held.get(step.chunk, 0.0))
        if not (merge_pairs and step.paired):
            peak = max(peak, now)
    return peak


def max_in_flight(order: list[Step], chunk: int, merge_pairs: bool = False) -> int:
    """Most micro-batches of one chunk between forward and (input-gradient) backward at once."""
    return int(peak_in_flight(order, {c: float(c == chunk) for c in {s.chunk for s in order}}, None, merge_pairs))


def virtual_stage(plan: Plan, stage: int, chunk: int) -> int:
    """Position of a stage's local chunk in its model copy."""
    return rank_chunks(plan.schedule, plan.pp, plan.vpp, stage)[chunk].model_stage


def microbatch_copy(plan: Plan, microbatch: int) -> int:
    """The model copy a micro-batch runs through (DualPipe feeds half of them from each end)."""
    if plan.schedule in BIDIRECTIONAL:
        return int(microbatch >= plan.microbatches // 2)
    return 0
