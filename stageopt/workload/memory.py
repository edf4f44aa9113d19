"""Per-rank peak memory of each pipeline stage, with a breakdown.

Weights, gradients and optimizer states follow the ZeRO stage (Rajbhandari et
al. 2020): bf16 weights, gradients in ``plan.grad_dtype``, and ``plan.optimizer_bytes``
per parameter of fp32 master weights plus Adam's two moments (12, or 8 with bf16 moments). Activations are the
tensors each chunk saves for backward (from the graph, by recompute mode)
times the micro-batches the schedule holds in flight at its peak; under a
zero-bubble schedule a micro-batch between its input- and weight-gradient
passes still holds what the weight gradients read. ``other``
holds what the loss keeps for backward and its peak beyond that (by the stack's
cross-entropy), the working set of a fully recomputed layer during its backward,
and ZeRO-3's gathered parameter buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from stageopt.graph.compile import saved_bytes_key
from stageopt.model.layer_types import HEAD_KINDS, is_layer, is_stored
from stageopt.parallel.schedule import max_in_flight, peak_in_flight, stage_order
from stageopt.workload.offload import offloaded_bytes, offloaded_layer_counts
from stageopt.workload.sharding import Workload

GIB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    def gib(self) -> dict[str, float]:
        parts = {k: getattr(self, k) / GIB for k in ("weights", "gradients", "optimizer", "activations", "other")}
        parts["total"] = self.total / GIB
        return parts


def shared_embedding_grad_bytes(work: Workload, stage: int) -> int:
    """Gradient bytes of the input embedding this stage all-reduces with the other end of the pipeline
    (0: none): its weight sits on the first and the last stage when tied to the output layer or reused by
    multi-token prediction (ModelSpec.embedding_on_both_ends); not under ZeRO-3, which shards it."""
    plan, model = work.plan, work.model
    if not model.embedding_on_both_ends or plan.pp == 1 or plan.step_zero >= 3 or stage not in (0, plan.pp - 1):
        return 0
    return -(-model.vocab * model.hidden // plan.tp) * plan.grad_bytes


def stage_params(work: Workload, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one rank of the stage.

    The output layer of a tied embedding is a second copy only when it sits on
    another stage than the embedding (pp > 1).
    """
    dense = work.stage_sum(stage, "local_dense")
    expert = work.stage_sum(stage, "local_expert")
    if work.plan.pp == 1:
        dense -= work.stage_sum(stage, "local_dense_uncounted")
    return dense, expert


def shard_degrees(work: Workload) -> tuple[int, int]:
    """Ranks that share (and can shard) dense and expert states under ZeRO (one copy's worth with
    hybrid sharding)."""
    plan = work.plan
    return plan.shard_dp * plan.cp, plan.expert_dp_ranks


# How the loss holds memory, in bytes a logit, by the stack's cross-entropy (FrameworkProfile.cross_entropy):
# kept from forward to backward, and the extra at the loss's peak. The graph's head saves an fp32 softmax
# (4 bytes a logit, ``logits_bytes``); these scale it.
LOSS_BYTES_PER_LOGIT = {"te_fused": (2.0, 0.0), "flash_attn": (2.0, 2.0), "in_place": (4.0, 2.0),
                        "native_fused": (4.0, 2.0), "pytorch": (4.0, 8.0)}


def loss_held(plan, logits_fp32_bytes):
    """Bytes the loss keeps for backward, for ``logits_fp32_bytes`` of fp32 logits."""
    return logits_fp32_bytes / 4.0 * LOSS_BYTES_PER_LOGIT[plan.framework.cross_entropy][0]


def loss_peak_extra(plan, logits_fp32_bytes):
    """Transient bytes at the loss beyond what it keeps (one loss runs at a time)."""
    return logits_fp32_bytes / 4.0 * LOSS_BYTES_PER_LOGIT[plan.framework.cross_entropy][1]


def zero3_gathered_layers(plan) -> int:
    """Layers whose ZeRO-3 parameters are gathered at once: the current one, plus the next where the
    stack prefetches it (FSDP, Megatron-FSDP); DeepSpeed of 2021 gathered one block at a time."""
    return 2 if plan.framework.zero3_prefetch else 1


def stage_memory(work: Workload, stage: int) -> MemoryBreakdown:
    plan = work.plan
    dense, expert = stage_params(work, stage)
    dense_shard, expert_shard = shard_degrees(work)

    def sharded(count_dense: float, count_expert: float, on: bool) -> float:
        return count_dense / dense_shard + count_expert / expert_shard if on else count_dense + count_expert

    weights = sharded(dense, expert, plan.step_zero >= 3) * plan.weight_bytes
    gradients = sharded(dense, expert, plan.step_zero >= 2) * plan.grad_held_bytes
    optimizer = sharded(dense, expert, plan.step_zero >= 1) * plan.optimizer_bytes
    order = stage_order(plan, stage)
    per_chunk = {c.local: work.chunk_sum(c, saved_bytes_key(plan)) for c in work.chunks[stage]}
    held = {c.local: work.chunk_sum(c, "wgrad_held_bytes") for c in work.chunks[stage]}
    in_flight_copy = 0.0
    if plan.offload_layers:  # pp = 1: one chunk holds every layer
        counts = offloaded_layer_counts(work.model, plan.offload_layers)
        off, in_flight_copy = offloaded_bytes(counts, {k: work.value(k, saved_bytes_key(plan)) for k in counts})
        per_chunk = {c: v - float(off) for c, v in per_chunk.items()}
    activations = peak_in_flight(order, per_chunk, held, plan.ep_overlap) + float(in_flight_copy)
    other = 0.0
    heads = [k for c in work.chunks[stage] for k in HEAD_KINDS if k in c.blocks]
    for chunk in work.chunks[stage]:
        for kind in HEAD_KINDS:
            if kind in chunk.blocks:
                other += chunk.blocks[kind] * loss_held(plan, work.value(kind, "logits_bytes")) * max_in_flight(
                    order, chunk.local, plan.ep_overlap)
    if heads:  # one loss at a time
        other += loss_peak_extra(plan, max(work.value(k, "logits_bytes") for k in heads))
    if plan.recompute == "full":  # the working set of a layer recomputed during its backward
        layer_kinds = [k for c in work.chunks[stage] for k in c.blocks if is_layer(k) and not is_stored(k)]
        other += max((work.value(k, "working_bytes") for k in layer_kinds), default=0.0)
    if plan.step_zero >= 3:
        layer_kinds = [k for c in work.chunks[stage] for k in c.blocks if is_layer(k)]
        biggest = max((work.value(k, "local_dense") + work.value(k, "local_expert") for k in layer_kinds), default=0.0)
        other += zero3_gathered_layers(plan) * biggest * plan.weight_bytes
    return MemoryBreakdown(weights=weights, gradients=gradients, optimizer=optimizer,
                           activations=activations, other=other)


def peak_memory(work: Workload) -> list[MemoryBreakdown]:
    return [stage_memory(work, s) for s in range(work.stages)]
