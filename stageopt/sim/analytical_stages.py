"""Pipeline stages for many candidate plans at once: their blocks, time per micro-batch and memory.

The analytical model looks at three representative stages (first, a fullest
middle one, last); this module says which blocks each holds, what one
micro-batch costs it, and its peak memory under the schedule.
"""

from __future__ import annotations

import numpy as np

from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.workload.memory import OPTIMIZER_BYTES


def layer_split(model: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layers on the first, a middle (the fullest) and the last stage (see workload.layer_counts)."""
    pp, vpp = c["pp"], c["vpp"]
    chunks = pp * vpp
    base, extra = np.floor(model.layers / chunks), np.mod(model.layers, chunks)
    n_mid = np.maximum(pp - 2, 0)
    first = np.where(pp == 1, model.layers, vpp * base + ((extra > n_mid) & (pp >= 2)))
    middle = np.where(pp > 2, vpp * base + (extra >= 1), 0)
    last = np.where(pp == 1, 0, vpp * base)
    return {"first": first, "middle": middle, "last": last}


def stage_compositions(model: ModelSpec, c: dict, layers: dict) -> dict[str, dict[str, np.ndarray]]:
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
        comp["sends"] = sends_per_microbatch(c, virt)
    return {"first": first, "middle": middle, "last": last}


def sends_per_microbatch(c: dict, which: str) -> np.ndarray:
    """Pipeline messages a stage sends per micro-batch (activations forward, gradients backward)."""
    pp, vpp = c["pp"], c["vpp"]
    chunks_boundaries = 2 * vpp - (1 if which in ("first", "last") else 0)
    return np.where(pp > 1, chunks_boundaries, 0)


def stage_time_parts(cost: dict, comp: dict, t_p2p: np.ndarray, c: dict) -> dict[str, np.ndarray]:
    parts = {"compute": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0}
    for kind, count in comp.items():
        if kind not in cost:
            continue
        parts["compute"] = parts["compute"] + count * (cost[kind]["fwd"] + cost[kind]["bwd"])
        for axis in ("tp", "cp", "ep"):
            parts[axis] = parts[axis] + count * cost[kind][f"comm_{axis}"]
    parts["p2p"] = comp["sends"] * t_p2p
    return parts


def stage_params(cost: dict, comp: dict, c: dict) -> tuple[np.ndarray, np.ndarray]:
    dense = sum(n * cost[k]["agg"]["local_dense"] for k, n in comp.items() if k in cost)
    dense = dense - np.where(c["pp"] == 1, sum(n * cost[k]["agg"]["local_dense_uncounted"]
                                               for k, n in comp.items() if k in cost), 0)
    expert = sum(n * cost[k]["agg"]["local_expert"] for k, n in comp.items() if k in cost)
    return dense, expert


def in_flight(c: dict, m: np.ndarray, which: str) -> tuple[np.ndarray, np.ndarray]:
    """(chunk-micro-batches held at the stage's peak, of which the stage holds v chunks), per schedule."""
    pp, vpp, sched = c["pp"], c["vpp"], c["schedule"]
    s = {"first": 0, "middle": 1, "last": pp - 1}[which]
    one_f_one_b = np.minimum(pp - s, m)
    interleaved = np.minimum(m * vpp, (pp - s - 1) * 2 + (vpp - 1) * pp + 1)
    held = np.where(sched == 0, m, np.where(sched == 2, interleaved / vpp, one_f_one_b))
    head_held = np.where(sched == 0, m, 1)
    return held, head_held


def stage_memory(proto: Plan, cost: dict, comp: dict, c: dict, m: np.ndarray, which: str) -> dict[str, np.ndarray]:
    dense, expert = stage_params(cost, comp, c)
    edp = c["dp"] / c["ep"]
    zero = c["zero"]

    def sharded(on):
        return np.where(on, dense / (c["dp"] * c["cp"]) + expert / (edp * c["cp"]), dense + expert)

    weights = sharded(zero >= 3) * proto.dtype_bytes
    gradients = sharded(zero >= 2) * proto.grad_bytes
    optimizer = sharded(zero >= 1) * OPTIMIZER_BYTES
    held, head_held = in_flight(c, m, which)
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

