"""The end of an iteration for many candidate plans: exposed data-parallel sync and the optimizer step.

Also ZeRO-3's per-micro-batch parameter gathers and gradient scatters, which
sit on the critical path of every micro-batch rather than at the end.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware import Hardware
from stageopt.hardware.network import collective_time
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_stages import stage_params


def stage_tail(hw: Hardware, proto: Plan, cost: dict, comp: dict, c: dict, m: np.ndarray,
               tied_params=0.0) -> dict[str, np.ndarray]:
    """Exposed data-parallel reduction and the optimizer step of one stage.

    ``tied_params``: parameters per rank of an input embedding tied to the output layer (0: untied);
    the first and the last pipeline stage all-reduce its gradient after the reduction (:func:`tied_sync`).
    """
    dense, expert = stage_params(cost, comp, c)
    expert_n, expert_stride = _expert_group(c)
    shard = c["shard_dp"] * c["cp"]  # one sharded copy (all of dp unless hybrid sharding)
    replicas = c["dp"] / c["shard_dp"]
    groups = ((dense, shard, c["tp"]), (expert, expert_n, expert_stride))
    g_bytes, w_bytes = proto.grad_bytes, proto.weight_bytes
    zero = c["zero"]
    layers = sum(n for k, n in comp.items() if k in cost)
    layers = np.maximum(layers, 1)
    stack = proto.framework

    def sync(kind, params, n, stride, per_param_bytes, bucket, per_block=False):
        return bucketed_time(hw, kind, params, per_param_bytes, n, stride, bucket, layers if per_block else 1)

    def step_sync(kind, params, n, stride, per_param_bytes, bucket):
        """The step's sync: DDP-style buckets, or FSDP's per-block collectives where ZeRO-3 is held across
        micro-batches (``fsdp_step``; with ``dp_overlap=off`` the whole stage at once, as the program)."""
        blocks = np.where(c["dp_overlap"], layers, 1)
        fsdp = bucketed_time(hw, kind, params, per_param_bytes, n, stride, stack.zero3_bucket_params, blocks)
        return np.where(c["fsdp_step"], fsdp, sync(kind, params, n, stride, per_param_bytes, bucket))

    bucket = proto.grad_bucket_params(c["dp"] * c["cp"])
    whole = (zero == 0) | stack.all_reduces_sharded_grads(proto.dtype)  # every rank receives all gradients
    grad_t = sum(np.where(whole, step_sync("all_reduce", p, n, s, g_bytes, bucket),
                          step_sync("reduce_scatter", p, n, s, g_bytes, bucket)) for p, n, s in groups)
    across = c["tp"] * shard  # hybrid sharding: each dense shard all-reduced over the copies
    grad_t = grad_t + np.where(replicas > 1, step_sync("all_reduce", dense / shard, replicas, across, g_bytes,
                                                       bucket), 0)
    gather_t = sum(np.where((zero >= 1) & (zero <= 2), step_sync("all_gather", p, n, s, w_bytes, bucket), 0)
                   for p, n, s in groups)
    bwd_one = sum(n * cost[k]["bwd"] for k, n in comp.items() if k in cost)
    fwd_one = sum(n * cost[k]["fwd"] for k, n in comp.items() if k in cost)
    overlap = c["dp_overlap"]
    grad_exposed = np.where(overlap, overlapped_sync(grad_t, bwd_one, layers, c, m), grad_t)
    gather_exposed = np.where(overlap, overlapped_sync(gather_t, fwd_one, layers, c, m), gather_t)
    hidden = grad_t - grad_exposed + gather_t - gather_exposed
    exposed = grad_exposed + gather_exposed + contention_share(hw) * hidden
    dp_time = np.where(zero >= 3, 0.0, exposed + tied_sync(hw, comp, c, tied_params, g_bytes))
    bucket = stack.zero3_bucket_params
    gathers = sum(sync("all_gather", p, n, s, w_bytes, bucket, per_block=True) for p, n, s in groups)
    scatters = sum(sync("reduce_scatter", p, n, s, g_bytes, bucket, per_block=True) for p, n, s in groups)
    scatters = scatters + np.where(replicas > 1, sync("all_reduce", dense / shard, replicas, across, g_bytes, bucket,
                                                      per_block=True), 0)
    zero3_mb = np.where(zero >= 3, 2 * gathers + scatters, 0.0)  # gathers in both passes, scatters in backward
    zero3_fwd = np.where(zero >= 3, gathers, 0.0)
    zero3_first = np.where(zero >= 3, gathers / layers, 0.0)  # one block's gather
    zero3_last = np.where(zero >= 3, scatters / layers, 0.0)  # one block's scatter
    sharded = zero >= 1
    updated = dense / np.where(sharded, shard, 1) + expert / np.where(sharded, expert_n, 1)
    opt_bytes = updated * (2 * proto.optimizer_bytes + proto.grad_held_bytes + w_bytes)  # states read and written
    optimizer = hw.gpu.vector_time_s(opt_bytes)  # one fused (multi-tensor) Adam kernel
    return {"dp": dp_time, "optimizer": optimizer, "zero3": zero3_mb, "zero3_fwd": zero3_fwd,
            "zero3_first": zero3_first, "zero3_last": zero3_last}


def overlapped_sync(sync_t, pass_t, layers, c: dict, m: np.ndarray) -> np.ndarray:
    """What a stage's overlapped data-parallel sync leaves exposed; ``pass_t``: one micro-batch's pass over
    the stage (backward for gradients, forward for parameter gathers).

    Buckets go out as their layers finish, so at least the last layer's share is exposed. Under 1F1B the
    gradients hide under the last micro-batch's backward (the gathers under the first's forward). Under the
    interleaved schedule Megatron-Core syncs each model chunk after that chunk's last backward, and the
    backward of the later chunks for the last group of micro-batches still follows: a chunk's sync runs
    under ``(1 + (vpp - 1) group) / vpp`` micro-batch passes, the first chunk's alone under one chunk pass;
    the gathers mirror it at the step's start, each chunk's before its first forward (``start_grad_sync`` /
    ``start_param_sync`` from ``schedules.py``'s interleaved loop).
    """
    vpp = np.where(c["interleaved"], c["vpp"], 1.0)
    group = np.minimum(c["vpp_group"], m)
    window = pass_t * (1 + (vpp - 1) * group) / vpp
    return np.maximum.reduce([sync_t / layers, (sync_t - pass_t) / vpp, sync_t - window])


def tied_sync(hw: Hardware, comp: dict, c: dict, tied_params, grad_bytes: int) -> np.ndarray:
    """The all-reduce of a tied embedding's gradient between the first and the last pipeline stage (the
    stages holding the embedding or the output layer), after the data-parallel reduction and before the
    optimizer, on the step's critical path (Megatron's ``_allreduce_word_embedding_grads`` in
    ``finalize_model_grads``; DeepSpeed's pipeline engine reduces tied weights alike)."""
    ends = np.asarray(comp.get("embedding", 0)) + np.asarray(comp.get("head", 0)) + np.asarray(comp.get("mtp_head", 0))
    tied = np.asarray(tied_params, dtype=float)
    stride = (c["pp"] - 1) * c["tp"] * c["cp"] * c["dp"]  # stage 0's rank and its peer on the last stage
    held = (c["pp"] > 1) & (ends > 0) & (tied > 0)
    return np.where(held, collective_time(hw, "all_reduce", tied * grad_bytes, 2, np.maximum(stride, 1)), 0.0)


def _expert_group(c: dict) -> tuple[np.ndarray, np.ndarray]:
    """Size and member stride of the group that reduces expert gradients: a stage's ranks are
    etp x ep x expert-DP (stageopt.parallel.ranks), so its members step over etp x ep ranks."""
    return c["expert_dp"], c["etp"] * c["ep"]


def bucketed_time(hw: Hardware, kind: str, params, per_param_bytes: int, n, stride, bucket_params,
                  min_buckets=1):
    """A collective over ``params`` parameters issued in buckets, each paying the collective's latency.

    Buckets hold at most ``bucket_params`` parameters (the stack's bucket size;
    None: no limit) and there are at least ``min_buckets`` (ZeRO-3 gathers at
    least once per block).
    """
    params = np.asarray(params, dtype=float)
    buckets = np.maximum(np.ceil(params / bucket_params), 1.0) if bucket_params is not None else np.ones_like(params)
    buckets = np.maximum(buckets, min_buckets)
    return np.where(params > 0, buckets * collective_time(hw, kind, params * per_param_bytes / buckets, n, stride), 0.0)


def zero3_exposed(hw: Hardware, tail: dict[str, np.ndarray], compute: tuple[np.ndarray, np.ndarray],
                  overlap: np.ndarray) -> np.ndarray:
    """ZeRO-3 communication left on a micro-batch's critical path; ``compute``: its (forward, backward) seconds.

    With overlap, each block's gather is prefetched while the previous block
    computes and scatters drain behind the backward, on their own stream. Each
    pass waits for its first block's gather (the backward re-gathers the block
    the forward released last) and the backward for its last block's scatter:
    nothing computes before the one or after the other. Beyond those, whatever a
    pass's communication has over that pass's compute is exposed (the forward's
    gathers; the backward's gathers and scatters, which no forward compute can
    hide), and the compute it runs beside slows (:func:`contention_share`).
    Without overlap all of it is exposed.
    """
    first, ends = tail["zero3_first"], tail["zero3_first"] + tail["zero3_last"]
    forward = first + np.maximum(tail["zero3_fwd"] - first - compute[0], 0.0)
    backward_comm = tail["zero3"] - tail["zero3_fwd"]
    backward = ends + np.maximum(backward_comm - ends - compute[1], 0.0)
    left = np.minimum(forward + backward, tail["zero3"])
    overlapped = left + contention_share(hw) * (tail["zero3"] - left)
    return np.where(overlap, overlapped, tail["zero3"])


def contention_share(hw: Hardware) -> float:
    """Seconds a step loses per second a data-parallel collective runs beside compute: the kernels
    progress at the GPU's ``overlapped_rate`` meanwhile (:mod:`stageopt.hardware.efficiency`)."""
    return 1.0 - hw.gpu.efficiency.overlapped_rate
