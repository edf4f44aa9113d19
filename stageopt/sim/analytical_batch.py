"""Closed-form iteration time and memory for many candidate plans at once.

Every cost comes from the compiled block graphs (per-op FLOPs and bytes,
per-collective sizes), evaluated on numpy arrays holding one entry per
candidate; only the plan fields that change the graph's structure
(recompute mode, sequence parallelism, dtypes) split a batch into groups.

Time model, per micro-batch of each pipeline stage: every compute op costs
the slower of its tensor-core time (a fixed kernel overhead plus FLOPs at the
GPU's asymptotic efficiency; causal flash attention skips the masked half) and
its HBM traffic; TP/CP/EP collectives are exposed; pipeline sends cost one
message each. Every pipeline stage is priced from what it holds (uneven splits
included). An iteration is ``m * t_max + (p-1)/v * t_mean`` (steady state
bound by the slowest stage, fill and drain shortened by interleaving; the
zero-bubble and DualPipe schedules run their step orders instead,
:mod:`stageopt.sim.analytical_schedules`), plus the
exposed part of the data-parallel reduction (overlapped with the last
micro-batch's backward when ``dp_overlap``) and the optimizer step.
"""

from __future__ import annotations

import numpy as np

from stageopt.graph.compile import saved_bytes_key
from stageopt.hardware import Hardware
from stageopt.model.layer_types import block_kinds, is_stored, model_block_counts, stored
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_blocks import block_costs
from stageopt.sim.analytical_pipeline import stage_column, stage_tables
from stageopt.sim.analytical_schedules import apply_split_schedules
from stageopt.sim.analytical_stages import message_times, stage_hops, stage_memory, stage_time_parts
from stageopt.sim.analytical_tail import stage_tail, zero3_exposed
from stageopt.workload.memory import GIB
from stageopt.workload.offload import exposed_copy_seconds, offloaded_bytes, offloaded_layer_counts

FIELDS = ("tp", "cp", "ep", "dp", "pp", "vpp", "mbs", "gbs", "zero", "offload_layers", "flushes")
SCHEDULE_CODE = {"gpipe": 0, "1f1b": 1, "interleaved": 2, "zbh1": 3, "zbv": 4, "dualpipe": 5, "dualpipev": 6,
                 "zb2p": 7}


def candidate_arrays(plans: list[Plan]) -> dict[str, np.ndarray]:
    arrays = {f: np.array([getattr(p, f) for p in plans], dtype=float) for f in FIELDS}
    arrays["zero"] = np.array([p.step_zero for p in plans], dtype=float)
    arrays["fsdp_step"] = np.array([p.fsdp_step_sync for p in plans], dtype=bool)  # step sync per FSDP block
    arrays["shard_dp"] = np.array([p.shard_dp for p in plans], dtype=float)  # dp unless hybrid sharding
    arrays["expert_dp"] = np.array([p.expert_dp_ranks for p in plans], dtype=float)  # experts' gradient group
    arrays["etp"] = np.array([p.expert_tp for p in plans], dtype=float)  # EP groups step by etp (ranks.py)
    arrays["schedule"] = np.array([SCHEDULE_CODE[p.schedule] for p in plans], dtype=float)
    arrays["vpp_group"] = np.array([p.microbatch_group for p in plans], dtype=float)  # interleaved warm-up depth
    arrays["interleaved"] = arrays["schedule"] == SCHEDULE_CODE["interleaved"]  # per-chunk DP sync windows
    arrays["dp_overlap"] = np.array([p.dp_overlap for p in plans], dtype=bool)
    arrays["tp_overlap"] = np.array([p.tp_overlap for p in plans], dtype=bool)
    arrays["cp_ring"] = np.array([p.cp_comm in ("p2p", "a2a+p2p") for p in plans], dtype=bool)
    arrays["cpa"] = np.array([p.cpa for p in plans], dtype=float)  # all-to-all part of hierarchical CP
    arrays["moe_overlap"] = np.array([bool(p.moe_overlap) for p in plans], dtype=bool)
    arrays["flex"] = np.array([p.dispatcher == "flex" for p in plans], dtype=bool)  # node-deduplicated dispatch
    return arrays


def evaluate_plans(model: ModelSpec, hw: Hardware, plans: list[Plan]) -> dict[str, np.ndarray]:
    """Per-candidate arrays of times (s), memory (GiB) and rates; plans must be valid."""
    groups: dict[tuple, list[int]] = {}
    for i, plan in enumerate(plans):
        groups.setdefault((plan.recompute, plan.recompute_modules, plan.sp, plan.dtype, plan.grad_dtype,
                           plan.framework, plan.cp_comm, plan.moe_overlap, plan.etp, plan.adam_moments,
                           plan.wgrad_store_bytes, plan.grad_staging_bytes, plan.fp8_recipe, plan.cuda_graphs,
                           plan.fp8_params, plan.bucket_mb),
                          []).append(i)
    out: dict[str, np.ndarray] = {}
    for index in groups.values():
        sub = [plans[i] for i in index]
        res = _evaluate_group(model, hw, sub, candidate_arrays(sub))
        for key, value in res.items():
            out.setdefault(key, np.zeros(len(plans)))[index] = value
    return out


def _stage_parts(model: ModelSpec, hw: Hardware, plans: list[Plan], tables: dict, cost: dict, c: dict,
                 m: np.ndarray) -> list[dict]:
    """Time parts, tail and memory of every stage (stages a plan lacks are all zeros)."""
    proto = plans[0]
    boundary = cost["embedding"]["agg"]["boundary_bytes"]  # the residual stream
    stages = []
    c["hops"] = []  # per stage: one message's seconds to the next and to the previous stage
    messages = message_times(hw, proto, boundary, c)
    offload, parts_offload = _offload(model, hw, proto, cost, c)
    tied = model.vocab * model.hidden / c["tp"] if model.embedding_on_both_ends else 0.0  # shared weight per rank
    for s in range(tables["valid"].shape[1]):
        comp = stage_column(tables, s)
        valid = tables["valid"][:, s]
        c["hops"].append(stage_hops(hw, messages, c, s, comp))
        parts = stage_time_parts(cost, comp, c["hops"][s], c)
        tail = stage_tail(hw, proto, cost, comp, c, m, tied)
        passes = (parts["compute_fwd"], parts["compute"] - parts["compute_fwd"])
        parts["zero3"] = zero3_exposed(hw, tail, passes, proto.framework.zero3_prefetch)
        parts["offload"] = parts_offload  # pp = 1 wherever it is not zero
        parts["time"] = sum(parts[k] for k in ("compute", "tp", "cp", "ep", "p2p", "zero3", "offload"))
        mem = stage_memory(proto, cost, comp, c, m, s, offload)
        stages.append({"parts": parts, "tail": tail, "mem": mem, "valid": valid})
    return stages


def _offload(model: ModelSpec, hw: Hardware, proto: Plan, cost: dict, c: dict
             ) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Activation offloading per plan: (bytes offloaded per micro-batch, bytes in flight) and its exposed
    copy seconds per micro-batch (:mod:`stageopt.workload.offload`); zeros where a plan offloads nothing."""
    n = c["offload_layers"]
    zeros = np.zeros(len(n))
    if not np.any(n):
        return (zeros, zeros), zeros
    counts = offloaded_layer_counts(model, n)
    key = saved_bytes_key(proto)
    saved = {k: cost[k]["agg"][key] for k in counts}
    exposed = exposed_copy_seconds(hw.gpu, counts, saved, {k: cost[k]["fwd"] for k in counts},
                                   {k: cost[k]["bwd"] for k in counts})
    return offloaded_bytes(counts, saved), exposed + zeros


def _pick(stages: list[dict], index: np.ndarray, getter) -> np.ndarray:
    """Per candidate, ``getter`` of the stage ``index`` names (np.choose stops at 64 stages)."""
    stack = np.stack([np.broadcast_to(getter(st), index.shape) for st in stages])
    return np.take_along_axis(stack, index[None, :], axis=0)[0]


def _evaluate_group(model: ModelSpec, hw: Hardware, plans: list[Plan], c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = plans[0]
    hw = hw.for_stack(proto.framework)
    partial = any(p.recomputed_per_chunk is not None for p in plans)
    cost = {k: block_costs(model, hw, proto, c, k) for k in block_kinds(model, with_stored=partial)}
    flushes = c["flushes"]  # back-to-back runs of the schedule a step, each syncing gradients
    m = c["gbs"] / (c["mbs"] * c["dp"] * flushes)  # micro-batches of one flush
    pp, vpp = c["pp"], c["vpp"]
    tables = stage_tables(model, plans)
    stages = _stage_parts(model, hw, plans, tables, cost, c, m)
    t_stage = np.stack([np.where(st["valid"], st["parts"]["time"], 0.0) for st in stages])
    runs = m * np.where(c["schedule"] == SCHEDULE_CODE["dualpipe"], 0.5, 1.0)  # micro-batches through each chunk
    t_max = t_stage.max(axis=0)
    crit = t_stage.argmax(axis=0)
    pipe = m * t_max + (pp - 1) / vpp * t_stage.sum(axis=0) / pp
    busy = m * t_max
    out = {key: runs * _pick(stages, crit, lambda st: st["parts"][key])
           for key in ("compute", "tp", "cp", "ep", "p2p", "offload")}
    out = {f"t_{k}": np.array(v, dtype=float) for k, v in out.items()}
    apply_split_schedules(model, plans, cost, c, c.pop("hops"), stages, pipe, busy, out,
                          hw.gpu.efficiency.a2a_overlap_saving)
    pipe, busy = flushes * pipe, flushes * busy
    out = {k: flushes * v for k, v in out.items()}
    tails = np.stack([np.where(st["valid"], flushes * st["tail"]["dp"] + st["tail"]["optimizer"], 0.0)
                      for st in stages])
    tail_crit = tails.argmax(axis=0)
    iteration = pipe + tails.max(axis=0)
    mem_crit = np.stack([np.where(st["valid"], st["mem"]["total"], 0.0) for st in stages]).argmax(axis=0)
    out["iteration_time_s"] = iteration
    bubble = pipe - busy
    out["t_bubble"] = np.where(np.abs(bubble) < 1e-9 * pipe, 0.0, bubble)  # an overlapped ZB-2p: 0, not -0.000
    out["t_dp"] = flushes * (_pick(stages, tail_crit, lambda st: st["tail"]["dp"])
                             + runs * _pick(stages, crit, lambda st: st["parts"]["zero3"]))
    out["t_optimizer"] = _pick(stages, tail_crit, lambda st: st["tail"]["optimizer"])
    for key in ("weights", "gradients", "optimizer", "activations", "other", "total"):
        out[f"mem_{key}"] = _pick(stages, mem_crit, lambda st: st["mem"][key]) / GIB
    _rates(model, hw, plans, tables, cost, c, m * flushes, iteration, out)
    return out


def recomputed_share(model: ModelSpec, tables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per layer kind, the share of its layers that partial full recompute re-runs, per plan (from the
    plans' stage tables)."""
    out = {}
    for kind in block_kinds(model):
        if stored(kind) in tables:
            rerun, kept = tables[kind].sum(axis=1), tables[stored(kind)].sum(axis=1)
            out[kind] = np.where(rerun + kept > 0, rerun / np.maximum(rerun + kept, 1), 1.0)
    return out


def _rates(model: ModelSpec, hw: Hardware, plans: list[Plan], tables: dict, cost: dict, c: dict, m: np.ndarray,
           iteration: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Model and hardware FLOP rates, MFU and tokens per second."""
    proto = plans[0]
    kinds = [k for k in cost if not is_stored(k)]
    counts_total = model_block_counts(model)
    ranks = c["dp"] * c["tp"] * c["cp"]
    model_flops = sum(counts_total[k] * (cost[k]["agg"]["fwd_flops"] + cost[k]["agg"]["bwd_flops"]) for k in kinds)
    share = recomputed_share(model, tables) if len(kinds) < len(cost) else {}
    recompute_flops = sum(counts_total[k] * cost[k]["agg"]["recompute_flops"] * share.get(k, 1.0) for k in kinds)
    gpus = ranks * c["pp"]
    out["model_flops"] = m * ranks * model_flops
    out["hardware_flops"] = m * ranks * (model_flops + recompute_flops)
    out["model_tflops_per_gpu"] = out["model_flops"] / (iteration * gpus) / 1e12
    out["hardware_tflops_per_gpu"] = out["hardware_flops"] / (iteration * gpus) / 1e12
    out["mfu"] = out["model_tflops_per_gpu"] / hw.gpu.peak(proto.dtype)
    out["tokens_per_s"] = c["gbs"] * model.seq / iteration
