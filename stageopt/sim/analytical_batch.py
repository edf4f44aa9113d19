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

from types import SimpleNamespace

import numpy as np

from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block, compile_op_table
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import Hardware
from stageopt.hardware.kernels import KERNEL_CODES, kernel_seconds
from stageopt.hardware.network import collective_time, flat_scaleout_time, p2p_time
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.workload.memory import GIB, OPTIMIZER_BYTES

FIELDS = ("tp", "cp", "ep", "dp", "pp", "vpp", "mbs", "gbs", "zero")
SCHEDULE_CODE = {"gpipe": 0, "1f1b": 1, "interleaved": 2}
ADAM_STATE_TRAFFIC = 2 * OPTIMIZER_BYTES  # fp32 master, m, v: read and written once per step


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
        groups.setdefault((plan.recompute, plan.sp, plan.dtype, plan.grad_dtype), []).append(i)
    out: dict[str, np.ndarray] = {}
    for (recompute, _sp, dtype, grad_dtype), index in groups.items():
        sub = [plans[i] for i in index]
        res = _evaluate_group(model, hw, sub[0], candidate_arrays(sub))
        for key, value in res.items():
            out.setdefault(key, np.zeros(len(plans)))[index] = value
    return out


def _block_costs(model: ModelSpec, hw: Hardware, proto: Plan, c: dict[str, np.ndarray], kind: str) -> dict:
    """Per micro-batch: compute seconds by phase, exposed comm seconds by axis, and the aggregates."""
    n = len(c["tp"])
    arch = arch_of(model, proto)
    values = symbol_values(model, SimpleNamespace(mbs=c["mbs"], tp=c["tp"], cp=c["cp"], ep=c["ep"]))
    block = compile_block(kind, arch, proto.recompute)
    agg = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)) for k, v in block.evaluate(values).items()}
    table = compile_op_table(kind, arch, proto.recompute)
    flops, nbytes = table.evaluate(values, n)
    codes = np.array([KERNEL_CODES[k] for k in table.kernels], dtype=int)[:, None]
    times = kernel_seconds(hw, proto.dtype, codes, flops, nbytes, (table.phases == 1)[:, None])
    cost = {"fwd": times[table.phases == 0].sum(axis=0), "bwd": times[table.phases != 0].sum(axis=0),
            "agg": agg}
    degree = {"tp": c["tp"], "cp": c["cp"], "ep": c["ep"]}
    stride = {"tp": np.ones(n), "cp": c["tp"], "ep": c["tp"] * c["cp"]}
    for axis in ("tp", "cp", "ep"):
        cost[f"comm_{axis}"] = np.zeros(n)
    for cs in block.collectives:
        size = agg[block.names[cs.index + 1]] if cs.kind == "all_gather" else agg[block.names[cs.index]]
        cost[f"comm_{cs.axis}"] = cost[f"comm_{cs.axis}"] + collective_time(
            hw, cs.kind, size, degree[cs.axis], stride[cs.axis])
    return cost


def _layer_split(model: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layers on the first, a middle (the fullest) and the last stage (see workload.layer_counts)."""
    pp, vpp = c["pp"], c["vpp"]
    chunks = pp * vpp
    base, extra = np.floor(model.layers / chunks), np.mod(model.layers, chunks)
    n_mid = np.maximum(pp - 2, 0)
    first = np.where(pp == 1, model.layers, vpp * base + ((extra > n_mid) & (pp >= 2)))
    middle = np.where(pp > 2, vpp * base + (extra >= 1), 0)
    last = np.where(pp == 1, 0, vpp * base)
    return {"first": first, "middle": middle, "last": last}


def _evaluate_group(model: ModelSpec, hw: Hardware, proto: Plan, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    kinds = ["embedding", "dense", "head"] + (["moe"] if model.is_moe else [])
    cost = {k: _block_costs(model, hw, proto, c, k) for k in kinds}
    layers = _layer_split(model, c)
    m = c["gbs"] / (c["mbs"] * c["dp"])
    pp, vpp = c["pp"], c["vpp"]
    stages = _stage_compositions(model, c, layers)
    boundary = cost["dense"]["agg"]["boundary_bytes"]
    t_p2p = p2p_time(hw, boundary, c["tp"] * c["cp"] * c["dp"])
    tail_parts = {name: _tail(hw, proto, cost, comp, c, m) for name, comp in stages.items()}
    parts = {}
    for name, comp in stages.items():
        parts[name] = _stage_time_parts(cost, comp, t_p2p, c)
        parts[name]["zero3"] = tail_parts[name]["zero3"]  # on the critical path of every micro-batch
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
    mem = {name: _stage_memory(proto, cost, comp, c, m, name) for name, comp in stages.items()}
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


def _stage_compositions(model: ModelSpec, c: dict, layers: dict) -> dict[str, dict[str, np.ndarray]]:
    """Block counts of the first, middle and last stage (leading dense layers sit on the first)."""
    pp = c["pp"]
    one = np.ones_like(pp)
    zero = np.zeros_like(pp)

    def split(n, dense_here):
        if not model.is_moe:
            return {"dense": n}
        return {"dense": dense_here, "moe": n - dense_here}

    first_dense = np.minimum(model.dense_layers, layers["first"]) if model.is_moe else None
    first = {"embedding": one, **split(layers["first"], first_dense), "head": np.where(pp == 1, one, zero)}
    middle = {"embedding": zero, **split(layers["middle"], zero), "head": zero}
    last = {"embedding": zero, **split(layers["last"], zero), "head": np.where(pp > 1, one, zero)}
    for comp, virt in ((first, "first"), (middle, "middle"), (last, "last")):
        comp["sends"] = _sends(c, virt)
    return {"first": first, "middle": middle, "last": last}


def _sends(c: dict, which: str) -> np.ndarray:
    """Pipeline messages a stage sends per micro-batch (activations forward, gradients backward)."""
    pp, vpp = c["pp"], c["vpp"]
    chunks_boundaries = 2 * vpp - (1 if which in ("first", "last") else 0)
    return np.where(pp > 1, chunks_boundaries, 0)


def _stage_time_parts(cost: dict, comp: dict, t_p2p: np.ndarray, c: dict) -> dict[str, np.ndarray]:
    parts = {"compute": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0}
    for kind, count in comp.items():
        if kind not in cost:
            continue
        parts["compute"] = parts["compute"] + count * (cost[kind]["fwd"] + cost[kind]["bwd"])
        for axis in ("tp", "cp", "ep"):
            parts[axis] = parts[axis] + count * cost[kind][f"comm_{axis}"]
    parts["p2p"] = comp["sends"] * t_p2p
    # Pipelined TP collectives hide behind the GEMMs next to them; a quarter (the first and
    # last chunk of each pipelined pair) stays exposed, and all of what exceeds the compute.
    hidden = np.minimum(0.75 * parts["tp"], parts["compute"])
    parts["tp"] = np.where(c["tp_overlap"], parts["tp"] - hidden, parts["tp"])
    return parts


def _params(cost: dict, comp: dict, c: dict) -> tuple[np.ndarray, np.ndarray]:
    dense = sum(n * cost[k]["agg"]["local_dense"] for k, n in comp.items() if k in cost)
    dense = dense - np.where(c["pp"] == 1, sum(n * cost[k]["agg"]["local_dense_uncounted"]
                                               for k, n in comp.items() if k in cost), 0)
    expert = sum(n * cost[k]["agg"]["local_expert"] for k, n in comp.items() if k in cost)
    return dense, expert


def _tail(hw: Hardware, proto: Plan, cost: dict, comp: dict, c: dict, m: np.ndarray) -> dict[str, np.ndarray]:
    """Exposed data-parallel reduction and the optimizer step of one stage."""
    dense, expert = _params(cost, comp, c)
    edp = c["dp"] / c["ep"]
    groups = ((dense, c["dp"] * c["cp"]), (expert, edp * c["cp"]))
    g_bytes, w_bytes = proto.grad_bytes, proto.dtype_bytes
    zero = c["zero"]
    grad_t = sum(np.where(zero == 0, collective_time(hw, "all_reduce", p * g_bytes, n, c["tp"]),
                          collective_time(hw, "reduce_scatter", p * g_bytes, n, c["tp"])) for p, n in groups)
    gather_t = sum(np.where((zero >= 1) & (zero <= 2), collective_time(hw, "all_gather", p * w_bytes, n, c["tp"]), 0)
                   for p, n in groups)
    layers = sum(n for k, n in comp.items() if k in ("dense", "moe", "embedding", "head"))
    layers = np.maximum(layers, 1)
    bwd_one = sum(n * cost[k]["bwd"] for k, n in comp.items() if k in cost)
    fwd_one = sum(n * cost[k]["fwd"] for k, n in comp.items() if k in cost)
    overlap = c["dp_overlap"]
    exposed = np.where(overlap, np.maximum(grad_t / layers, grad_t - bwd_one), grad_t)
    exposed = exposed + np.where(overlap, np.maximum(gather_t / layers, gather_t - fwd_one), gather_t)
    dp_time = np.where(zero >= 3, 0.0, exposed)
    zero3_mb = np.where(zero >= 3, _zero3_time(hw, groups, w_bytes, g_bytes), 0.0)
    shard = np.where(zero >= 1, 1.0, 0.0)
    updated = dense / np.where(shard > 0, c["dp"] * c["cp"], 1) + expert / np.where(shard > 0, edp * c["cp"], 1)
    opt_bytes = updated * (ADAM_STATE_TRAFFIC + g_bytes + w_bytes)
    optimizer = opt_bytes / (hw.gpu.hbm_gbps * 1e9 * hw.gpu.efficiency.memory_fraction)
    return {"dp": dp_time, "optimizer": optimizer, "zero3": zero3_mb}


def _zero3_time(hw: Hardware, groups, w_bytes: int, g_bytes: int) -> np.ndarray:
    """ZeRO-3's per-layer gathers (forward and backward) and gradient reduce-scatter, per micro-batch.

    Calibrated on Narayanan et al. 2021, Table 2: ZeRO-3 at 384-2,240 A100s ran at
    the speed of flat rings bound by each GPU's NIC, with no measurable overlap,
    so they are charged that way (over the scale-out tier, exposed).
    """
    total = 0.0
    for params, n in groups:
        gather = flat_scaleout_time(hw, "all_gather", params * w_bytes, n)
        scatter = flat_scaleout_time(hw, "reduce_scatter", params * g_bytes, n)
        total = total + 2 * gather + scatter
    return total


def _in_flight(c: dict, m: np.ndarray, which: str) -> tuple[np.ndarray, np.ndarray]:
    """(chunk-micro-batches held at the stage's peak, of which the stage holds v chunks), per schedule."""
    pp, vpp, sched = c["pp"], c["vpp"], c["schedule"]
    s = {"first": 0, "middle": 1, "last": pp - 1}[which]
    one_f_one_b = np.minimum(pp - s, m)
    interleaved = np.minimum(m * vpp, (pp - s - 1) * 2 + (vpp - 1) * pp + 1)
    held = np.where(sched == 0, m, np.where(sched == 2, interleaved / vpp, one_f_one_b))
    head_held = np.where(sched == 0, m, 1)
    return held, head_held


def _stage_memory(proto: Plan, cost: dict, comp: dict, c: dict, m: np.ndarray, which: str) -> dict[str, np.ndarray]:
    dense, expert = _params(cost, comp, c)
    edp = c["dp"] / c["ep"]
    zero = c["zero"]

    def sharded(on):
        return np.where(on, dense / (c["dp"] * c["cp"]) + expert / (edp * c["cp"]), dense + expert)

    weights = sharded(zero >= 3) * proto.dtype_bytes
    gradients = sharded(zero >= 2) * proto.grad_bytes
    optimizer = sharded(zero >= 1) * OPTIMIZER_BYTES
    held, head_held = _in_flight(c, m, which)
    saved = sum(n * cost[k]["agg"]["saved_bytes"] for k, n in comp.items() if k in cost)
    activations = held * saved
    other = comp["head"] * cost["head"]["agg"]["logits_bytes"] * head_held
    layer_kinds = [k for k in ("dense", "moe") if k in cost and k in comp]
    if proto.recompute == "full":
        other = other + np.maximum.reduce([np.where(comp[k] > 0, cost[k]["agg"]["working_bytes"], 0)
                                           for k in layer_kinds])
    biggest = np.maximum.reduce([np.where(comp[k] > 0, cost[k]["agg"]["local_dense"] + cost[k]["agg"]["local_expert"], 0)
                                 for k in layer_kinds])
    other = other + np.where(zero >= 3, 2 * biggest * proto.dtype_bytes, 0)
    total = weights + gradients + optimizer + activations + other
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer,
            "activations": activations, "other": other, "total": total}
