"""Per-stage, per-iteration totals a rank of each pipeline stage executes.

Block costs are per micro-batch; a stage runs each of its chunks once per
micro-batch forward and backward. Data-parallel gradient reduction happens
once per iteration (ZeRO 0-2; ZeRO-3 gathers parameters per layer and
reduce-scatters gradients per micro-batch, as FSDP and DeepSpeed do).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from stageopt.parallel.placement import model_stage_count, neighbour, rank_chunks
from stageopt.parallel.ranks import EMBEDDING_GROUP, dense_dp_groups, expert_dp_group, group_size
from stageopt.workload.memory import (MemoryBreakdown, shard_degrees, shared_embedding_grad_bytes, stage_memory,
                                      stage_params)
from stageopt.workload.sharding import Workload

OPTIMIZER_FLOPS_PER_PARAM = 12  # Adam with weight decay, per parameter and step


@dataclass(frozen=True, slots=True)
class CollectiveUse:
    """Collectives of one kind on one communicator group, per rank per iteration."""

    group: str  # tp | cp | ep | dp_cp | edp_cp | embd (see stageopt.parallel.ranks.GROUP_AXES)
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all
    phase: str  # fwd | bwd | recompute | dp (end of iteration) | zero3
    count: int
    bytes_each: float  # buffer size: input for AR/RS/A2A, gathered output for AG
    group_size: int

    @property
    def bytes_total(self) -> float:
        return self.count * self.bytes_each


@dataclass(frozen=True)
class StageStats:
    stage: int
    ops: int
    flops: dict[str, float]  # fwd, bwd, recompute, optimizer, total
    attention_flops: float  # part of flops in (causal) attention score/context products
    vector_flops: float
    bytes_accessed: float
    collectives: tuple[CollectiveUse, ...]
    p2p_bytes: float  # sent by one rank per iteration (activations forward, gradients backward)
    memory: MemoryBreakdown
    params_local: float


def _block_collectives(work: Workload, stage: int) -> list[CollectiveUse]:
    plan = work.plan
    found: dict[tuple, int] = defaultdict(int)
    for chunk in work.chunks[stage]:
        m = work.runs(chunk)
        for kind, n in chunk.blocks.items():
            block, vals = work.blocks[kind], work.values[kind]
            for c in block.collectives:
                size = group_size(plan, c.axis)
                if size == 1:
                    continue
                in_b, out_b = float(vals[block.names[c.index]]), float(vals[block.names[c.index + 1]])
                bytes_each = out_b if c.kind == "all_gather" else in_b
                found[(c.axis, c.kind, c.phase, bytes_each, size)] += n * m
    return [CollectiveUse(g, k, p, cnt, b, s) for (g, k, p, b, s), cnt in found.items()]


def _dp_collectives(work: Workload, stage: int) -> list[CollectiveUse]:
    plan = work.plan
    out: list[CollectiveUse] = []
    dense, expert = stage_params(work, stage)
    shard_group, replicas = dense_dp_groups(plan)
    for group, params in ((shard_group, dense), (expert_dp_group(plan), expert)):
        size = group_size(plan, group)
        if size == 1 or params == 0:
            continue
        grads, weights = params * plan.grad_bytes, params * plan.weight_bytes
        across = replicas if group == shard_group and replicas else ""
        if plan.step_zero == 0:
            out.append(CollectiveUse(group, "all_reduce", "dp", 1, grads, size))
        elif plan.step_zero in (1, 2):
            out += [CollectiveUse(group, plan.grad_sync_kind, "dp", 1, grads, size),
                    CollectiveUse(group, "all_gather", "dp", 1, weights, size)]
            if across:
                out.append(CollectiveUse(across, "all_reduce", "dp", 1, grads / size, group_size(plan, across)))
        else:
            layers = sum(n for c in work.chunks[stage] for k, n in c.blocks.items()) or 1
            runs = sum(work.runs(c) * n for c in work.chunks[stage] for k, n in c.blocks.items()) or 1
            out += [CollectiveUse(group, "all_gather", "zero3", 2 * runs, weights / layers, size),
                    CollectiveUse(group, "reduce_scatter", "zero3", runs, grads / layers, size)]
            if across:
                out.append(CollectiveUse(across, "all_reduce", "zero3", runs, grads / layers / size,
                                         group_size(plan, across)))
    shared = shared_embedding_grad_bytes(work, stage)
    if shared:
        out.append(CollectiveUse(EMBEDDING_GROUP, "all_reduce", "dp", 1, shared, 2))
    tp_partial = work.stage_sum(stage, "local_dense_tp_partial")
    if expert_dp_group(plan) == "edp_cp":  # with etp=1 the expert group spans tp: no separate tp sum
        tp_partial += work.stage_sum(stage, "local_expert_tp_partial")
    if tp_partial and plan.tp > 1:
        out.append(CollectiveUse("tp", "all_reduce", "dp", 1, tp_partial * plan.grad_bytes, plan.tp))
    return out


def _p2p_bytes(work: Workload, stage: int) -> float:
    """Bytes one rank sends per iteration: one message per micro-batch at every boundary to another rank."""
    plan = work.plan
    n_model = model_stage_count(plan.schedule, plan.pp, plan.vpp)
    sends = sum(work.runs(work.chunks[stage][place.local])
                for place in rank_chunks(plan.schedule, plan.pp, plan.vpp, stage) for step in (1, -1)
                if neighbour(plan.schedule, plan.pp, n_model, place, step) in ("next", "prev"))
    return sends * work.message_bytes(work.chunks[stage][0])


def stage_stats(work: Workload, stage: int) -> StageStats:
    plan = work.plan
    flops = {phase: work.iteration_sum(stage, f"{phase}_flops") for phase in ("fwd", "bwd", "recompute")}
    dense, expert = stage_params(work, stage)
    dense_shard, expert_shard = shard_degrees(work)
    updated = dense / dense_shard + expert / expert_shard if plan.step_zero >= 1 else dense + expert
    flops["optimizer"] = OPTIMIZER_FLOPS_PER_PARAM * updated
    flops["total"] = sum(flops.values())
    attn = sum(work.iteration_sum(stage, f"{p}_attn_flops") for p in ("fwd", "bwd", "recompute"))
    vector = sum(work.iteration_sum(stage, f"{p}_vector_flops") for p in ("fwd", "bwd", "recompute"))
    accessed = sum(work.iteration_sum(stage, f"{p}_bytes") for p in ("fwd", "bwd", "recompute"))
    ops = sum(work.runs(c) * n * sum(work.blocks[k].op_counts.values())
              for c in work.chunks[stage] for k, n in c.blocks.items())
    colls = _block_collectives(work, stage) + _dp_collectives(work, stage)
    return StageStats(stage=stage, ops=ops + 1, flops=flops, attention_flops=attn, vector_flops=vector,
                      bytes_accessed=accessed, collectives=tuple(colls), p2p_bytes=_p2p_bytes(work, stage),
                      memory=stage_memory(work, stage), params_local=dense + expert)


def all_stage_stats(work: Workload) -> list[StageStats]:
    return [stage_stats(work, s) for s in range(work.stages)]


def flops_per_iteration(work: Workload, stats: list[StageStats]) -> float:
    """Training FLOPs of one iteration summed over every rank."""
    ranks_per_stage = work.plan.dp * work.plan.tp * work.plan.cp
    return sum(s.flops["total"] for s in stats) * ranks_per_stage
