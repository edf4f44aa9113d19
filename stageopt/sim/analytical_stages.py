"""Pipeline stages for many candidate plans at once: their blocks, time per micro-batch and memory.

Given what a stage holds (:mod:`stageopt.sim.analytical_pipeline`), this
module says what one micro-batch costs it and its peak memory under the
schedule.
"""

from __future__ import annotations

import numpy as np

from stageopt.graph.compile import saved_bytes_key
from stageopt.hardware import Hardware
from stageopt.hardware.network import pipeline_hop_crosses, pipeline_message_time
from stageopt.model.layer_types import HEAD_KINDS, is_layer, is_stored
from stageopt.parallel.plan import Plan
from stageopt.workload.memory import loss_held, loss_peak_extra, zero3_gathered_layers


def stage_time_parts(cost: dict, comp: dict, hops: tuple[np.ndarray, np.ndarray], c: dict) -> dict[str, np.ndarray]:
    """Compute and exposed communication of one stage per micro-batch; ``hops``: seconds of one message to the
    next and to the previous stage (:func:`stage_hops`)."""
    parts = {"compute": 0.0, "compute_fwd": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0}
    for kind, count in comp.items():
        if kind not in cost:
            continue
        parts["compute"] = parts["compute"] + count * (cost[kind]["fwd"] + cost[kind]["bwd"])
        parts["compute_fwd"] = parts["compute_fwd"] + count * cost[kind]["fwd"]
        for axis in ("tp", "cp", "ep"):
            parts[axis] = parts[axis] + count * cost[kind][f"comm_{axis}"]
    parts["p2p"] = comp["sends_next"] * hops[0] + (comp["sends"] - comp["sends_next"]) * hops[1]
    return parts


def message_times(hw: Hardware, proto: Plan, boundary, c: dict) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one pipeline message inside a node and between nodes, per plan."""
    stride = c["tp"] * c["cp"] * c["dp"]  # ranks per stage: the pipeline axis is outermost
    return tuple(pipeline_message_time(hw, proto, boundary, c["tp"], stride, crosses) for crosses in (False, True))


def stage_hops(hw: Hardware, messages: tuple[np.ndarray, np.ndarray], c: dict, stage: int,
               comp: dict) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one pipeline message from ``stage`` to the next and to the previous stage, per plan
    (``messages``: :func:`message_times`).

    A hop between nodes runs at the scale-out tier even where most of a narrow pipeline's hops stay in a
    node. Ranks of one stage may sit on both sides of a node boundary (72-GPU NVLink domains): the stage
    runs at the pace of its slowest rank, the first or the last (``comp``: the stage's message counts)."""
    stride = c["tp"] * c["cp"] * c["dp"]
    pp = np.maximum(c["pp"], 1)
    inside, between = messages
    to_next, to_prev = comp["sends_next"], comp["sends"] - comp["sends_next"]
    first, last = (tuple(np.where(pipeline_hop_crosses(hw, stride, stage, (stage + step) % pp, offset), between, inside)
                         for step in (1, -1)) for offset in (0, stride - 1))
    slower = to_next * last[0] + to_prev * last[1] > to_next * first[0] + to_prev * first[1]
    return tuple(np.where(slower, b, a) for a, b in zip(first, last))


def stage_params(cost: dict, comp: dict, c: dict) -> tuple[np.ndarray, np.ndarray]:
    dense = sum(n * cost[k]["agg"]["local_dense"] for k, n in comp.items() if k in cost)
    dense = dense - np.where(c["pp"] == 1, sum(n * cost[k]["agg"]["local_dense_uncounted"]
                                               for k, n in comp.items() if k in cost), 0)
    expert = sum(n * cost[k]["agg"]["local_expert"] for k, n in comp.items() if k in cost)
    return dense, expert


def in_flight(c: dict, m: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk-micro-batches held at stage ``s``'s peak, of which the stage holds v chunks), per schedule."""
    pp, vpp, sched = c["pp"], c["vpp"], c["schedule"]
    one_f_one_b = np.minimum(pp - s, m)
    interleaved = np.minimum(m * vpp, (pp - s - 1) * 2 + (vpp - 1) * c["vpp_group"] + 1)
    held = np.where(sched == 0, m, np.where(sched == 2, interleaved / vpp, one_f_one_b))
    head_held = np.where(sched == 0, m, 1)
    return held, head_held


def stage_memory(proto: Plan, cost: dict, comp: dict, c: dict, m: np.ndarray, s: int,
                 offload: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per-rank memory parts of stage ``s``; ``offload`` is (bytes a micro-batch offloads to the host, bytes
    of the offloaded layer in flight) per plan (:mod:`stageopt.workload.offload`)."""
    dense, expert = stage_params(cost, comp, c)
    zero = c["zero"]

    def sharded(on):
        return np.where(on, dense / (c["shard_dp"] * c["cp"]) + expert / c["expert_dp"], dense + expert)

    weights = sharded(zero >= 3) * proto.weight_bytes
    gradients = sharded(zero >= 2) * proto.grad_held_bytes
    optimizer = sharded(zero >= 1) * proto.optimizer_bytes
    held, head_held = in_flight(c, m, s)
    saved = sum(n * cost[k]["agg"][saved_bytes_key(proto)] for k, n in comp.items() if k in cost)
    off, in_flight_copy = offload if offload is not None else (0.0, 0.0)
    activations = held * (saved - off) + in_flight_copy
    logits = loss_held(proto, sum(comp[k] * cost[k]["agg"]["logits_bytes"] for k in HEAD_KINDS if k in comp)) * head_held
    heads = [np.where(comp[k] > 0, cost[k]["agg"]["logits_bytes"], 0.0) for k in HEAD_KINDS if k in comp]
    other = logits + (loss_peak_extra(proto, np.maximum.reduce(heads)) if heads else 0.0)
    layer_kinds = [k for k in cost if is_layer(k) and k in comp]
    if proto.recompute == "full":  # the working set of a layer recomputed during its backward
        other = other + np.maximum.reduce([np.where(comp[k] > 0, cost[k]["agg"]["working_bytes"], 0)
                                           for k in layer_kinds if not is_stored(k)])
    biggest = np.maximum.reduce([np.where(comp[k] > 0, cost[k]["agg"]["local_dense"] + cost[k]["agg"]["local_expert"], 0)
                                 for k in layer_kinds])
    other = other + np.where(zero >= 3, zero3_gathered_layers(proto) * biggest * proto.weight_bytes, 0)
    total = weights + gradients + optimizer + activations + other
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer,
            "activations": activations, "other": other, "total": total, "logits": logits}

