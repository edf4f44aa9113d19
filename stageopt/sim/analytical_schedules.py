"""Zero-bubble, DualPipe and combined-1F1B schedules in the analytical model: makespan and activation peaks.

Why not a closed form: ZB-H1's ``(p-1)(F+I-W)`` and DualPipe's
``(PP/2-1)(F&B+B-3W)`` hold for uniform stages and equal pass times; uneven
stages, the embedding and loss chunks and unequal F, I and W make the real
orders deviate. So the model runs the very step orders the traces encode
with every stage's and
chunk's pass times as arrays over candidate plans: one walk per schedule shape
(schedule, pp, vpp, micro-batches) prices every plan of that shape at once
(:mod:`stageopt.parallel.schedule_dag`).

Pass times per micro-batch and chunk: F is the chunk's forward kernels plus
its exposed forward collectives and its send; I is the backward kernels other
than weight gradients (recompute included) plus the rest of the exposed
collectives and its send; W is the weight-gradient kernels. A DualPipe pair
costs the larger of its two chunks' compute and of their communication: each
hides the other's all-to-all and pipeline messages. A combined-1F1B pair
(``ep_overlap``, Megatron-Core's merged forward and backward) hides only the
expert all-to-alls; its TP and CP collectives and its sends stay in line
with the compute, and of the time an all-to-all overlaps that work the step
saves only the GPU's ``a2a_overlap_saving`` (the kernels contend for SMs and HBM). Activation memory walks
the same orders (F saves, I keeps what W reads, W or B frees).
"""

from __future__ import annotations

import numpy as np

from stageopt.graph.compile import saved_bytes_key
from stageopt.model.layer_types import HEAD_KINDS
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.parallel.schedule import schedule_orders
from stageopt.parallel.schedule_dag import PAIR, compile_dag
from stageopt.parallel.steps import KINDS, Step
from stageopt.sim.analytical_pipeline import SEND_COLUMNS, chunk_tables
from stageopt.sim.analytical_stages import stage_time_parts
from stageopt.workload.memory import loss_held

SPLIT_SCHEDULES = ("zbh1", "zb2p", "zbv", "dualpipe", "dualpipev")
# Schedules built to run as a parallelogram, each stage ending as much after the one before it as it started:
# only they lose their bubble when a stack lets iterations overlap (see _overlapped_iteration).
PARALLELOGRAM_SCHEDULES = ("zb2p",)


def overlaps_iterations(plan: Plan) -> bool:
    """Whether the analytical model prices this plan's iterations as overlapping (:func:`_overlapped_iteration`)."""
    return plan.framework.optimizer_post_validation and plan.schedule in PARALLELOGRAM_SCHEDULES


# What _chunk_passes gives per chunk and micro-batch, in the order of the passes array: the F, B, I and W passes'
# seconds; compute of F and of B; communication in F and in B; expert all-to-all in F and in B; sends of F and B.
PASS_NAMES = ("F", "B", "I", "W", "cF", "cB", "xF", "xB", "eF", "eB", "sF", "sB")


def _rows(tree: dict, index: list[int]) -> dict:
    """The same nested dict of per-candidate arrays, cut to ``index``."""
    return {k: (_rows(v, index) if isinstance(v, dict) else np.asarray(v)[index]) for k, v in tree.items()}


def _chunk_passes(cost: dict, counts: dict[str, np.ndarray], hops: tuple[np.ndarray, np.ndarray], c: dict,
                  zero3: np.ndarray) -> dict[str, np.ndarray]:
    """F, I, W seconds of one chunk per micro-batch, and its compute and communication apart (for pairs);
    ``hops``: seconds of one message to the next and to the previous stage (a pass ends with its sends)."""
    kinds = [k for k in counts if k in cost]
    comp = {k: counts[k] for k in kinds}
    comp["sends"] = counts["send_f"] + counts["send_b"]
    comp["sends_next"] = counts["send_f"] * counts["f_next"] + counts["send_b"] * counts["b_next"]
    parts = stage_time_parts(cost, comp, hops, c)
    exposed = parts["tp"] + parts["cp"] + parts["ep"]
    raw = sum(comp[k] * (cost[k]["comm_tp"] + cost[k]["comm_cp"] + cost[k]["comm_ep"]) for k in kinds)
    fwd_raw = sum(comp[k] * cost[k]["comm_fwd"] for k in kinds)
    share = np.divide(fwd_raw, raw, out=np.zeros_like(exposed), where=raw > 0)
    c_f = sum(comp[k] * cost[k]["fwd"] for k in kinds)
    c_w = sum(comp[k] * cost[k]["wgrad"] for k in kinds)
    c_i = sum(comp[k] * cost[k]["bwd"] for k in kinds) - c_w
    t_f, t_b = (np.where(counts[k] > 0, hops[0], hops[1]) for k in ("f_next", "b_next"))
    x_f = exposed * share + counts["send_f"] * t_f + zero3 / 2
    x_b = exposed * (1 - share) + counts["send_b"] * t_b + zero3 / 2
    ep_raw = sum(comp[k] * cost[k]["comm_ep"] for k in kinds)
    ep_share = np.divide(sum(comp[k] * cost[k]["ep_fwd"] for k in kinds), ep_raw, out=np.zeros_like(exposed),
                         where=ep_raw > 0)
    return {"F": c_f + x_f, "I": c_i + x_b, "W": c_w, "B": c_i + c_w + x_b, "cF": c_f, "cB": c_i + c_w,
            "xF": x_f, "xB": x_b, "eF": parts["ep"] * ep_share, "eB": parts["ep"] * (1 - ep_share),
            "sF": counts["send_f"] * t_f, "sB": counts["send_b"] * t_b}


def _activation_peaks(orders, saved: np.ndarray, held: np.ndarray, logits: np.ndarray,
                      merge_pairs: bool = False) -> tuple[list, list]:
    """Per stage: peak activation bytes over its order, and peak head logits held.

    ``saved``, ``held``, ``logits``: arrays (stages, chunks, candidates).
    """
    acts, heads = [], []
    for s, order in enumerate(orders):
        chunks = np.array([st.chunk for st in order])
        kinds = np.array([st.kind for st in order])
        on_full = (kinds == "F").astype(float) - (kinds == "B") - (kinds == "I")
        on_held = (kinds == "I").astype(float) - (kinds == "W")
        deltas = on_full[:, None] * saved[s, chunks] + on_held[:, None] * held[s, chunks]
        # a combined-1F1B pair saves and frees together (schedule.peak_in_flight): skip its midpoint
        seen = ~np.array([st.paired and merge_pairs for st in order], dtype=bool)
        acts.append(np.maximum(np.cumsum(deltas, axis=0)[seen].max(axis=0, initial=0.0), 0.0))
        heads.append(np.maximum(np.cumsum(on_full[:, None] * logits[s, chunks], axis=0)[seen].max(axis=0, initial=0.0),
                                0.0))
    return acts, heads


def schedule_shape_results(model: ModelSpec, plans: list[Plan], cost: dict, c: dict, hops: list[tuple],
                           zero3: list[np.ndarray], a2a_saving: float = 1.0) -> dict[str, object]:
    """Makespan, busiest stage's work and per-stage activation peaks for plans of one schedule shape.

    ``cost``, ``c``, ``hops`` (per stage: a message's seconds to the next and the previous stage) and
    ``zero3`` (per stage) hold rows of these plans only; ``a2a_saving`` is
    the GPU's share of overlapped all-to-all time a combined-1F1B pair saves.
    """
    plan, n = plans[0], len(plans)
    pp, vpp, m = plan.pp, plan.vpp, plan.microbatches
    orders = schedule_orders(plan.schedule, pp, vpp, m, plan.ep_overlap, plan.microbatch_group)
    dag = compile_dag(plan.schedule, pp, vpp, orders)
    table = chunk_tables(model, plans)
    n_chunks = table["embedding"].shape[2]
    layers = sum(table[k] for k in table if k not in SEND_COLUMNS)
    per_stage = layers.sum(axis=2)
    names = PASS_NAMES
    passes = np.zeros((len(names), pp, n_chunks, n))
    mem = np.zeros((3, pp, n_chunks, n))  # saved, held for W, head logits
    kinds = [k for k in table if k in cost]
    for s in range(pp):
        for ch in range(n_chunks):
            counts = {k: table[k][:, s, ch] for k in table}
            frac = np.divide(layers[:, s, ch], per_stage[:, s], out=np.zeros(n), where=per_stage[:, s] > 0)
            got = _chunk_passes(cost, counts, hops[s], c, zero3[s] * frac)
            passes[:, s, ch] = [got[k] for k in names]
            mem[0, s, ch] = sum(counts[k] * cost[k]["agg"][saved_bytes_key(plan)] for k in kinds)
            mem[1, s, ch] = sum(counts[k] * cost[k]["agg"]["wgrad_held_bytes"] for k in kinds)
            mem[2, s, ch] = loss_held(plan, sum(counts[k] * cost[k]["agg"]["logits_bytes"] for k in HEAD_KINDS
                                                if k in counts))
    durations, comm = _node_times(dag, passes, plan.ep_overlap, a2a_saving)
    arrival = _unwaited_sends(dag, passes) if plan.schedule in plan.framework.async_p2p_schedules else None
    if arrival is not None:
        durations, comm = durations - arrival, comm - arrival
    makespan = dag.finish_times(durations, arrival).max(axis=0)
    if overlaps_iterations(plan):
        makespan = _overlapped_iteration(plan, orders, passes, a2a_saving, makespan)
    busy = dag.per_stage_sum(durations)
    busiest = busy.argmax(axis=0)
    acts, heads = _activation_peaks(orders, mem[0], mem[1], mem[2], plan.ep_overlap)
    return {"makespan": makespan, "busy": busy.max(axis=0), "activations": acts, "logits": heads,
            "busiest": busiest, "comm": np.take_along_axis(dag.per_stage_sum(comm), busiest[None], 0)[0]}


def _unwaited_sends(dag, passes: np.ndarray) -> np.ndarray:
    """Seconds of the sends a stage does not wait for, per node: on a runtime that flushes each send with the
    receives posted after it and waits on the whole batch before the pass consuming them (the zero-bubble
    fork's), a send followed by a W pass, which receives nothing, goes alone and overlaps the W."""
    nxt = dag.next_on_stage()
    before_w = (nxt >= 0) & (dag.kind[nxt.clip(min=0)] == KINDS.index("W"))
    sent = [passes[PASS_NAMES.index(k), dag.stage, dag.chunk] for k in ("sF", "sB")]
    backward = np.isin(dag.kind, (KINDS.index("B"), KINDS.index("I")))
    sends = np.select([dag.kind[:, None] == KINDS.index("F"), backward[:, None]], sent, 0.0)
    return np.where(before_w[:, None], sends, 0.0)


def _node_times(dag, passes: np.ndarray, ep_overlap: bool, a2a_saving: float) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of every node of ``dag`` and the communication in them, from the chunks' pass times."""
    single = passes[:4, dag.stage, dag.chunk]  # (F, B, I, W) of each node's chunk: (4, nodes, n)
    durations = np.take_along_axis(single, np.minimum(dag.kind, 3)[None, :, None], 0)[0]
    comm = np.select([dag.kind[:, None] == 0, dag.kind[:, None] == 3], [passes[6, dag.stage, dag.chunk], 0.0],
                     passes[7, dag.stage, dag.chunk])
    pairs = np.flatnonzero(dag.kind == PAIR)
    if len(pairs):
        st, cf, cb = dag.stage[pairs], dag.chunk[pairs], dag.chunk2[pairs]
        compute = passes[4, st, cf] + passes[5, st, cb]
        hidden = passes[8, st, cf] + passes[9, st, cb] if ep_overlap else passes[6, st, cf] + passes[7, st, cb]
        serial = compute + passes[6, st, cf] + passes[7, st, cb] - hidden  # what stays in line
        saving = a2a_saving if ep_overlap else 1.0  # contention (GpuEfficiency)
        durations[pairs] = serial + hidden - saving * np.minimum(serial, hidden)
        comm[pairs] = durations[pairs] - compute
    return durations, comm


def _overlapped_iteration(plan: Plan, orders, passes: np.ndarray, a2a_saving: float,
                          makespan: np.ndarray) -> np.ndarray:
    """Time per iteration when successive iterations overlap: the stack bypasses the optimizer's global
    synchronisation (Qi et al. 2024, sec. 4, post-update validation), so each stage starts the next
    iteration as soon as it has finished this one and its inputs arrive. Priced as the second of two
    iterations run back to back: their makespan less one iteration's. Only the parallelogram schedules
    (ZB-2p, whose stages end in the order they start) are priced so: the paper introduced the bypass because
    a synchronised optimizer step breaks that parallelogram (Qi et al. 2024, sec. 4). The fork runs
    ZB-H1 and ZB-V with the bypass too, but their first stage ends about last, and the paper's own ZB-V bubble
    rates (its Table 8: 7.0, 5.3 and 2.7% for p = 16) are those of one iteration: our ZB-V order timed once at
    the pass-time ratio its ZB-H2 figures imply (F : I : W = 1 : 1.2 : 0.7) gives 6.1, 4.6 and 2.4%, overlapped
    5.1, 3.9 and 2.0%; the tail of our ZB-V order (later ranks end on deferred W passes) is what would
    overlap, and the fork's does not show it."""
    m = plan.microbatches
    twice = tuple(order + tuple(Step(s.microbatch + m, s.chunk, s.kind, s.paired) for s in order)
                  for order in orders)
    dag = compile_dag(plan.schedule, plan.pp, plan.vpp, twice)
    durations, _ = _node_times(dag, passes, plan.ep_overlap, a2a_saving)
    arrival = _unwaited_sends(dag, passes) if plan.schedule in plan.framework.async_p2p_schedules else None
    if arrival is not None:
        durations = durations - arrival
    return dag.finish_times(durations, arrival).max(axis=0) - makespan


def split_schedule_groups(plans: list[Plan]) -> dict[tuple, list[int]]:
    """Indices of the plans that run a zero-bubble or DualPipe schedule or pair passes (ep_overlap), by shape."""
    groups: dict[tuple, list[int]] = {}
    for i, plan in enumerate(plans):
        if plan.schedule in SPLIT_SCHEDULES or plan.ep_overlap:
            key = (plan.schedule, plan.pp, plan.vpp, plan.microbatches, plan.first_layers, plan.last_layers,
                   plan.embed_split, plan.loss_split, plan.layout, plan.ep_overlap, plan.microbatch_group)
            groups.setdefault(key, []).append(i)
    return groups


def apply_split_schedules(model: ModelSpec, plans: list[Plan], cost: dict, c: dict, hops: list[tuple],
                          stages: list[dict], pipe: np.ndarray, busy: np.ndarray, out: dict,
                          a2a_saving: float = 1.0) -> None:
    """Overwrite ``pipe``, ``busy``, the time breakdown in ``out`` and the stages' activation memory for
    zero-bubble and DualPipe plans; the busiest stage's exposed communication is split over tp, cp, ep and
    p2p in the proportions of its collectives before overlap."""
    n = len(plans)
    for index in split_schedule_groups(plans).values():
        sub = [plans[i] for i in index]
        zero3 = [np.broadcast_to(st["parts"]["zero3"], (n,))[index] for st in stages]
        sub_hops = [tuple(np.broadcast_to(t, (n,))[index] for t in hop) for hop in hops]
        res = schedule_shape_results(model, sub, _rows(cost, index), _rows(c, index), sub_hops, zero3, a2a_saving)
        pipe[index] = res["makespan"]
        busy[index] = res["busy"]
        _breakdown(stages, index, res, out)
        for s, st in enumerate(stages[:sub[0].pp]):
            mem = st["mem"]
            for key in ("weights", "gradients", "optimizer", "activations", "other", "logits"):
                mem[key] = np.array(np.broadcast_to(mem[key], (n,)), dtype=float)
            mem["activations"][index] = res["activations"][s]
            mem["other"][index] += res["logits"][s] - mem["logits"][index]
            mem["logits"][index] = res["logits"][s]
            mem["total"] = sum(mem[k] for k in ("weights", "gradients", "optimizer", "activations", "other"))


def _breakdown(stages: list[dict], index: list[int], res: dict, out: dict) -> None:
    axes = ("tp", "cp", "ep", "p2p")
    n = len(out["t_compute"])
    raw = {a: np.take_along_axis(np.stack([np.broadcast_to(st["parts"][a], (n,))[index] for st in stages]),
                                 res["busiest"][None], 0)[0] for a in axes}
    total = sum(raw.values())
    for a in axes:
        out[f"t_{a}"][index] = res["comm"] * np.divide(raw[a], total, out=np.zeros_like(total), where=total > 0)
    out["t_compute"][index] = res["busy"] - res["comm"]
