"""How long each node of a stage program takes on a machine: kernels, collectives, messages.

Why here, below the simulators: the replay backend runs these durations, and
the trace writer puts the same numbers into each compute node's
``duration_micros`` for ASTRA-sim, so every backend times a node one way.
Kernels come from :mod:`stageopt.hardware.kernels`, collectives and sends from
:mod:`stageopt.hardware.network`.
"""

from __future__ import annotations

import numpy as np

from stageopt.graph.overlap import userbuffer_chunks
from stageopt.hardware import Hardware
from stageopt.hardware.kernels import KERNEL_CODES, Kernels, chunked_kernel_seconds
from stageopt.hardware.network import (collective_time, exposed_beside_gemm, exposed_under_gemm, pipeline_hop_crosses,
                                       pipeline_message_time)
from stageopt.parallel.ranks import group_stride

from stageopt.program.nodes import COLL, COMP, COPY, NEXT, SEND, StageProgram
from stageopt.workload import Workload

RING_COMMS = ("p2p", "a2a+p2p")  # cp_comm values whose K/V exchange over "cp" is a ring under attention
# the data-parallel communicators (GradSync.dp_groups)
DP_GROUP_NAMES = ("dp_cp", "edp_cp", "shard_cp", "replicate", "tp_edp_cp")


def kernel_durations(comp: list, plan, hw: Hardware, chunks: int = 1) -> np.ndarray:
    """Seconds of compute nodes, each GEMM run as ``chunks`` GEMMs of 1/chunks of its rows (userbuffer overlap)."""
    shape = np.array([n.gemm for n in comp], dtype=float).T
    return chunked_kernel_seconds(hw, plan.dtype, Kernels(
        code=np.array([KERNEL_CODES[n.kernel] for n in comp]),
        flops=np.array([n.num_ops for n in comp], dtype=float),
        nbytes=np.array([n.tensor_size for n in comp], dtype=float),
        m=shape[0], n=shape[1], k=shape[2], batch=shape[3], cast=shape[4],
        precision=np.array([n.precision for n in comp]), backward=np.array([n.phase == "bwd" for n in comp]),
        count=np.array([n.launches for n in comp]), gpus=plan.gpus),
        np.array([n.gemm_group for n in comp]), chunks, plan.framework.attention_kernel,
        wgrad_store_bytes=plan.wgrad_store_bytes, fp8_recipe=plan.fp8_recipe, cuda_graphs=plan.cuda_graphs)


def userbuffer_partners(nodes, tp: int) -> dict[int, list[int]]:
    """GEMM node ids that TP userbuffer overlap splits, by how many GEMMs each becomes
    (:func:`stageopt.graph.overlap.userbuffer_chunks`; weight gradients never; each GEMM once)."""
    out: dict[int, list[int]] = {}
    charged: set[int] = set()
    for n in nodes:
        if n.type != COLL or n.group != "tp" or not n.overlap:
            continue
        chunks = userbuffer_chunks(n.collective, n.phase, tp)
        partners = [j for j in n.overlap if not nodes[j].wgrad and j not in charged]
        if chunks > 1 and partners:
            charged.update(partners)
            out.setdefault(chunks, []).extend(partners)
    return out


def node_durations(program: StageProgram, work: Workload, hw: Hardware, tp_async: bool = True) -> np.ndarray:
    """Busy time of every node of a stage program, in seconds.

    ``tp_async``: price the TP collectives the stack overlaps with GEMMs (userbuffer overlap, the backward
    collectives issued beside a GEMM) by what those GEMMs leave exposed (False: whole after the (chunked)
    GEMMs, ASTRA-sim's rule, which runs every collective in full).
    """
    plan = work.plan
    hw = hw.for_stack(plan.framework)
    nodes = program.nodes
    out = np.zeros(len(nodes))
    comp = [n for n in nodes if n.type == COMP]
    if comp:
        out[[n.id for n in comp]] = kernel_durations(comp, plan, hw)
    if plan.tp_overlap:
        for chunks, partners in userbuffer_partners(nodes, plan.tp).items():
            out[partners] = np.maximum(out[partners], kernel_durations([nodes[j] for j in partners], plan, hw, chunks))
    by_kind: dict[tuple[str, str, int], list] = {}
    for n in nodes:
        if n.type == COLL:
            by_kind.setdefault((n.collective, n.group, n.group_size), []).append(n)
    for (collective, group, size), members in by_kind.items():
        idx = np.array([n.id for n in members])
        sizes = np.array([n.comm_size for n in members], dtype=float) * (size if collective == "all_gather" else 1)
        buckets = np.array([collective_buckets(n, s, plan) for n, s in zip(members, sizes)])
        copies = work.model.top_k if (collective, group, plan.dispatcher) == ("all_to_all", "ep", "flex") else 1
        routing = (work.model.router_groups, work.model.router_group_topk, work.model.experts)
        out[idx] = buckets * collective_time(hw, collective, sizes / buckets, size, group_stride(plan, group), copies,
                                             routing)
    for n in nodes:  # TP userbuffer overlap; ring (p2p) context parallelism under its attention blocks
        if n.type == COLL and n.overlap and ((n.group == "tp" and plan.tp_overlap and tp_async)
                                             or (n.group == "cp" and plan.cp_comm in RING_COMMS)):
            chunks = plan.tp if n.group == "tp" else plan.cp // plan.cpa  # the ring's ranks
            out[n.id] = exposed_under_gemm(out[n.id], out[list(n.overlap)].sum(), chunks)
        elif n.type == COLL and n.async_overlap and tp_async and plan.framework.tp_async_backward:  # beside a GEMM
            out[n.id] = exposed_beside_gemm(out[n.id], out[list(n.async_overlap)].sum())
    copies = [n for n in nodes if n.type == COPY]  # activation offloading, over the host link
    if copies:
        out[[n.id for n in copies]] = hw.gpu.host_copy_seconds(np.array([n.comm_size for n in copies], dtype=float))
    sends = [n for n in nodes if n.type == SEND]
    if sends:
        idx = np.array([n.id for n in sends])
        sizes = np.array([n.comm_size for n in sends], dtype=float)
        whole = sizes * plan.tp if plan.p2p_scatter_gather else sizes
        peers = np.array([(program.stage + (1 if n.peer == NEXT else -1)) % plan.pp for n in sends])
        stride = group_stride(plan, "pp")
        # the stage's slowest rank, its first or its last, where its ranks straddle a node boundary
        times = [pipeline_message_time(hw, plan, whole, plan.tp, stride,
                                       pipeline_hop_crosses(hw, stride, program.stage, peers, offset))
                 for offset in (0, stride - 1)]
        out[idx] = max(times, key=lambda t: float(np.sum(t)))
    return out


def collective_buckets(node, size: float, plan) -> float:
    """How many collectives the stack issues for one data-parallel node (each pays the latency).

    Gradient syncs go in buckets of ``grad_bucket_params`` (FSDP's step-end sync, where the stack holds
    parameters across micro-batches, as ZeRO-3's); ZeRO-3 gathers and scatters in buckets of
    ``zero3_bucket_params`` (None: the node's block at once).
    ``size`` is the whole buffer (an all-gather's output). The trace writer
    issues the same number of collectives (:mod:`stageopt.program.tier_split`).
    """
    bucket = {"dp": plan.dp_sync_bucket_params, "zero3": plan.framework.zero3_bucket_params}.get(node.phase)
    if bucket is None or node.group not in DP_GROUP_NAMES:
        return 1.0
    per_param = plan.weight_bytes if node.collective == "all_gather" else plan.grad_bytes
    return max(float(np.ceil(size / per_param / bucket)), 1.0)
