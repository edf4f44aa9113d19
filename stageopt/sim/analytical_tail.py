"""The end of an iteration for many candidate plans: exposed data-parallel sync and the optimizer step.

Also ZeRO-3's per-micro-batch parameter gathers and gradient scatters, which
sit on the critical path of every micro-batch rather than at the end.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware import Hardware
from stageopt.hardware.network import collective_time, flat_scaleout_time
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_stages import stage_params
from stageopt.workload.memory import OPTIMIZER_BYTES

ADAM_STATE_TRAFFIC = 2 * OPTIMIZER_BYTES  # fp32 master, m, v: read and written once per step

def stage_tail(hw: Hardware, proto: Plan, cost: dict, comp: dict, c: dict, m: np.ndarray) -> dict[str, np.ndarray]:
    """Exposed data-parallel reduction and the optimizer step of one stage."""
    dense, expert = stage_params(cost, comp, c)
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
    zero3_mb = np.where(zero >= 3, zero3_time(hw, groups, w_bytes, g_bytes), 0.0)
    shard = np.where(zero >= 1, 1.0, 0.0)
    updated = dense / np.where(shard > 0, c["dp"] * c["cp"], 1) + expert / np.where(shard > 0, edp * c["cp"], 1)
    opt_bytes = updated * (ADAM_STATE_TRAFFIC + g_bytes + w_bytes)
    optimizer = opt_bytes / (hw.gpu.hbm_gbps * 1e9 * hw.gpu.efficiency.memory_fraction)
    return {"dp": dp_time, "optimizer": optimizer, "zero3": zero3_mb}


def zero3_time(hw: Hardware, groups, w_bytes: int, g_bytes: int) -> np.ndarray:
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

