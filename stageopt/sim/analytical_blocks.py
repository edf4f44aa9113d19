"""Per-block costs for many candidate plans at once: kernel times and exposed block collectives.

Each block's ops are priced by the one kernel model (:mod:`stageopt.hardware.kernels`)
and its TP/CP/EP collectives by the network model, per micro-batch, as numpy
arrays with one entry per candidate.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block, compile_op_table
from stageopt.graph.overlap import userbuffer_chunks
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import Hardware
from stageopt.hardware.kernels import KERNEL_CODES, Kernels, chunked_kernel_seconds
from stageopt.hardware.network import collective_time, exposed_beside_gemm, exposed_under_gemm
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan


def block_costs(model: ModelSpec, hw: Hardware, proto: Plan, c: dict[str, np.ndarray], kind: str) -> dict:
    """Per micro-batch: compute seconds by phase, exposed comm seconds by axis, and the aggregates."""
    n = len(c["tp"])
    arch = arch_of(model, proto)
    values = symbol_values(model, SimpleNamespace(mbs=c["mbs"], tp=c["tp"], cp=c["cp"], ep=c["ep"], cpa=c["cpa"]))
    block = compile_block(kind, arch, proto.recompute)
    agg = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)) for k, v in block.evaluate(values).items()}
    table = compile_op_table(kind, arch, proto.recompute)
    rows = table.evaluate(values, n)
    world = c["tp"] * c["cp"] * c["dp"] * c["pp"]  # every GPU waits on the slowest (kernels.Kernels.gpus)

    def priced(chunks=1.0):
        """Every op's seconds, each GEMM run as ``chunks`` GEMMs of 1/chunks of its rows (userbuffer overlap)."""
        return chunked_kernel_seconds(hw, proto.dtype, Kernels(
            code=np.array([KERNEL_CODES[k] for k in table.kernels], dtype=int)[:, None],
            flops=rows["flops"], nbytes=rows["bytes"], m=rows["m"], n=rows["n"], k=rows["k"], batch=rows["batch"],
            cast=rows["cast"],
            precision=table.precision[:, None], backward=(table.phases == 1)[:, None],
            count=rows["launches"], gpus=world), table.groups, chunks, proto.framework.attention_kernel,
            wgrad_store_bytes=proto.wgrad_store_bytes, fp8_recipe=proto.fp8_recipe, cuda_graphs=proto.cuda_graphs)

    times = priced()
    cost = {"fwd": times[table.phases == 0].sum(axis=0), "bwd": times[table.phases != 0].sum(axis=0),
            "agg": agg}
    cost["wgrad"] = times[table.wgrad].sum(axis=0) if table.wgrad is not None else np.zeros(n)  # part of bwd
    if proto.grad_staging_bytes:  # gradients staged before their reduction after every backward (one kernel)
        params = agg["local_dense"] + agg["local_expert"]
        staged = np.where(params > 0, hw.gpu.vector_time_s(proto.grad_staging_bytes * params), 0.0)
        cost["bwd"], cost["wgrad"] = cost["bwd"] + staged, cost["wgrad"] + staged
    _collective_costs(cost, model, hw, proto, c, block, times, UserbufferChunks(priced, times, table, c["tp"]))
    return cost


def _collective_costs(cost: dict, model: ModelSpec, hw: Hardware, proto: Plan, c: dict, block, times: np.ndarray,
                      chunked: "UserbufferChunks") -> None:
    """Add each block collective's exposed seconds (``comm_<axis>``, their forward share ``comm_fwd``) to
    ``cost``, and to its compute what userbuffer chunking adds to the GEMMs it pipelines."""
    n, agg = len(c["tp"]), cost["agg"]
    cost["comm_fwd"] = np.zeros(n)  # forward-phase share of the comm_* times below
    cost["ep_fwd"] = np.zeros(n)  # forward-phase share of comm_ep
    # "cp" is the ring part of hierarchical CP (all of cp otherwise), "cpa" its all-to-all part inside it
    degree = {"tp": c["tp"], "cp": c["cp"] / c["cpa"], "ep": c["ep"], "cpa": c["cpa"]}
    stride = {"tp": np.ones(n), "cp": c["tp"] * c["cpa"], "ep": c["etp"], "cpa": c["tp"]}
    for axis in ("tp", "cp", "ep", "cpa"):
        cost[f"comm_{axis}"] = np.zeros(n)
    groups: dict[tuple[str, str], list] = {}
    for cs in block.collectives:
        groups.setdefault((cs.kind, cs.axis), []).append(cs)
    for (kind_, axis), members in groups.items():  # one vectorized call per collective kind and axis
        sizes = np.array([agg[block.names[cs.index + 1]] if kind_ == "all_gather" else agg[block.names[cs.index]]
                          for cs in members])
        copies = np.where(c["flex"], model.top_k, 1) if (axis, kind_) == ("ep", "all_to_all") else 1
        comm = collective_time(hw, kind_, sizes, degree[axis], stride[axis], copies,
                               (model.router_groups, model.router_group_topk, model.experts))
        for i, cs in enumerate(members):
            pipelined = np.zeros(n, dtype=bool)
            if cs.hides:  # TP: userbuffer overlap; CP: the ring's K/V under attention; EP: dispatch under shared
                pipelined = np.broadcast_to({"tp": c["tp_overlap"], "cp": c["cp_ring"]}.get(axis, c["moe_overlap"]),
                                            (n,))
                extra = np.where(pipelined, chunked.extra(cs), 0.0) if axis == "tp" else 0.0
                phase = "fwd" if cs.phase == "fwd" else "bwd"  # recompute runs inside the backward
                cost[phase] = cost[phase] + extra
                hidden = exposed_under_gemm(comm[i], times[list(cs.hides)].sum(axis=0) + extra, degree[axis])
                comm[i] = np.where(pipelined, hidden, comm[i])
            if cs.async_hides and proto.framework.tp_async_backward:  # issued beside one GEMM on its own stream
                beside = exposed_beside_gemm(comm[i], times[list(cs.async_hides)].sum(axis=0))
                comm[i] = np.where(pipelined, comm[i], beside)
            if cs.phase == "fwd":
                cost["comm_fwd"] = cost["comm_fwd"] + comm[i]
                cost["ep_fwd"] = cost["ep_fwd"] + (comm[i] if axis == "ep" else 0.0)
        cost[f"comm_{axis}"] = cost[f"comm_{axis}"] + comm.sum(axis=0)
    cost["comm_cp"] = cost["comm_cp"] + cost.pop("comm_cpa")  # both parts of CP are CP communication


class UserbufferChunks:
    """What userbuffer overlap adds to the GEMMs it pipelines: each runs as several smaller GEMMs
    (:func:`stageopt.graph.overlap.userbuffer_chunks`), which fill fewer waves and store their own tiles, at one
    fixed cost per GEMM (:func:`stageopt.hardware.kernels.chunked_kernel_seconds`). Each GEMM is charged once,
    by the first collective it pairs with."""

    def __init__(self, priced, times: np.ndarray, table, tp: np.ndarray):
        self._priced, self._times, self._tp = priced, times, np.asarray(tp, dtype=float)
        self._wgrad = table.wgrad if table.wgrad is not None else np.zeros(len(times), dtype=bool)
        self._by_chunks: dict[object, np.ndarray] = {}
        self._charged: set[int] = set()

    def extra(self, cs) -> np.ndarray | float:
        chunks = userbuffer_chunks(cs.kind, cs.phase, "tp")  # "tp": each candidate's own tp (a ring's chunks)
        rows = [j for j in cs.hides if not self._wgrad[j] and j not in self._charged]
        if chunks == 1 or not rows:
            return 0.0
        self._charged.update(rows)
        if chunks not in self._by_chunks:
            self._by_chunks[chunks] = self._priced(self._tp[None, :] if chunks == "tp" else float(chunks))
        return np.maximum(self._by_chunks[chunks][rows].sum(axis=0) - self._times[rows].sum(axis=0), 0.0)
