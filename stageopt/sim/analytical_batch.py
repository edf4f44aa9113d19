"""Closed-form iteration time and memory for many candidate plans at once.

Every cost comes from the compiled block graphs (per-op FLOPs and bytes,
per-collective sizes), evaluated on numpy arrays holding one entry per
candidate; only the plan fields that change the graph's structure
(recompute mode, sequence parallelism, dtypes) split a batch into groups.

Time model, per micro-batch of each pipeline stage: every compute op costs
the slower of its tensor-core time (a fixed kernel overhead plus FLOPs at the
GPU's asymptotic efficiency; causal flash attention skips the masked half) and
its HBM traffic; TP/CP/EP collectives are exposed; pipeline sends cost one
message each. An iteration is ``m * t_max + (p-1)/v * t_mean`` (steady state
bound by the slowest stage, fill and drain shortened by interleaving), plus the
exposed part of the data-parallel reduction (overlapped with the last
micro-batch's backward when ``dp_overlap``) and the optimizer step.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware import Hardware
from stageopt.hardware.network import pipeline_message_time
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_blocks import block_costs
from stageopt.sim.analytical_stages import layer_split, stage_compositions, stage_memory, stage_time_parts
from stageopt.sim.analytical_tail import stage_tail, zero3_exposed
from stageopt.workload.memory import GIB

FIELDS = ("tp", "cp", "ep", "dp", "pp", "vpp", "mbs", "gbs", "zero")
SCHEDULE_CODE = {"gpipe": 0, "1f1b": 1, "interleaved": 2}


def candidate_arrays(plans: list[Plan]) -> dict[str, np.ndarray]:
    arrays = {f: np.array([getattr(p, f) for p in plans], dtype=float) for f in FIELDS}
    arrays["schedule"] = np.array([SCHEDULE_CODE[p.schedule] for p in plans], dtype=float)
    arrays["dp_overlap"] = np.array([p.dp_overlap for p in plans], dtype=bool)
    arrays["tp_overlap"] = np.array([p.tp_overlap for p in plans], dtype=bool)
    return arrays


def evaluate_plans(model: ModelSpec, hw: Hardware, plans: list[Plan]) -> dict[str, np.ndarray]:
    """Per-candidate arrays of times (s), memory (GiB) and rates; plans must be valid."""
    groups: dict[tuple, list[int]] = {}
    for i, plan in enumerate(plans):
        groups.setdefault((plan.recompute, plan.sp, plan.dtype, plan.grad_dtype, plan.framework), []).append(i)
    out: dict[str, np.ndarray] = {}
    for index in groups.values():
        sub = [plans[i] for i in index]
        res = _evaluate_group(model, hw, sub[0], candidate_arrays(sub))
        for key, value in res.items():
            out.setdefault(key, np.zeros(len(plans)))[index] = value
    return out


def _evaluate_group(model: ModelSpec, hw: Hardware, proto: Plan, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    kinds = ["embedding", "dense", "head"] + (["moe"] if model.is_moe else [])
    cost = {k: block_costs(model, hw, proto, c, k) for k in kinds}
    layers = layer_split(model, c)
    m = c["gbs"] / (c["mbs"] * c["dp"])
    pp, vpp = c["pp"], c["vpp"]
    stages = stage_compositions(model, c, layers)
    boundary = cost["dense"]["agg"]["boundary_bytes"]
    t_p2p = pipeline_message_time(hw, proto, boundary, c["tp"], c["tp"] * c["cp"] * c["dp"])
    tail_parts = {name: stage_tail(hw, proto, cost, comp, c, m) for name, comp in stages.items()}
    parts = {}
    for name, comp in stages.items():
        parts[name] = stage_time_parts(cost, comp, t_p2p, c)
        parts[name]["zero3"] = zero3_exposed(tail_parts[name], parts[name]["compute"], proto.framework.zero3_prefetch)
    t_stage = {name: sum(p[k] for k in ("compute", "tp", "cp", "ep", "p2p", "zero3")) for name, p in parts.items()}
    t_max = np.maximum.reduce([t_stage["first"], np.where(pp > 2, t_stage["middle"], 0), t_stage["last"]])
    total_layers_t = (model.layers - layers["first"] - layers["last"]) / np.maximum(layers["middle"], 1)
    t_sum = t_stage["first"] + np.where(pp > 1, t_stage["last"], 0) + np.where(pp > 2, total_layers_t * t_stage["middle"], 0)
    t_mean = t_sum / pp
    pipe = m * t_max + (pp - 1) / vpp * t_mean
    crit = np.where(t_stage["first"] >= t_max, 0, np.where(t_stage["last"] >= t_max, 2, 1))
    names = ("first", "middle", "last")

    def pick(key):
        return np.choose(crit, [parts[nm][key] for nm in names])

    tail = np.maximum.reduce([tail_parts[nm]["dp"] + tail_parts[nm]["optimizer"] for nm in names])
    tail_crit = np.argmax(np.stack([tail_parts[nm]["dp"] + tail_parts[nm]["optimizer"] for nm in names]), axis=0)
    iteration = pipe + tail
    mem = {name: stage_memory(proto, cost, comp, c, m, name) for name, comp in stages.items()}
    totals = np.stack([mem[nm]["total"] for nm in names])
    totals[1] = np.where(pp > 2, totals[1], 0)
    mem_crit = np.argmax(totals, axis=0)
    out = {"iteration_time_s": iteration}
    for key in ("compute", "tp", "cp", "ep", "p2p"):
        out[f"t_{key}"] = m * pick(key)
    out["t_bubble"] = pipe - m * t_max
    out["t_dp"] = np.choose(tail_crit, [tail_parts[nm]["dp"] for nm in names]) + m * pick("zero3")
    out["t_optimizer"] = np.choose(tail_crit, [tail_parts[nm]["optimizer"] for nm in names])
    for key in ("weights", "gradients", "optimizer", "activations", "other", "total"):
        out[f"mem_{key}"] = np.choose(mem_crit, [mem[nm][key] for nm in names]) / GIB
    counts_total = {"embedding": 1.0, "head": 1.0, "dense": float(model.layers - model.moe_layers),
                    "moe": float(model.moe_layers)}
    ranks = c["dp"] * c["tp"] * c["cp"]
    model_flops = sum(counts_total[k] * (cost[k]["agg"]["fwd_flops"] + cost[k]["agg"]["bwd_flops"]) for k in kinds)
    recompute_flops = sum(counts_total[k] * cost[k]["agg"]["recompute_flops"] for k in kinds)
    gpus = ranks * pp
    out["model_flops"] = m * ranks * model_flops
    out["hardware_flops"] = m * ranks * (model_flops + recompute_flops)
    out["model_tflops_per_gpu"] = out["model_flops"] / (iteration * gpus) / 1e12
    out["hardware_tflops_per_gpu"] = out["hardware_flops"] / (iteration * gpus) / 1e12
    out["mfu"] = out["model_tflops_per_gpu"] / hw.gpu.peak(proto.dtype)
    out["tokens_per_s"] = c["gbs"] * model.seq / iteration
    return out

