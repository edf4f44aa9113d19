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
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import Hardware
from stageopt.hardware.kernels import KERNEL_CODES, kernel_seconds
from stageopt.hardware.network import collective_time
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan


def block_costs(model: ModelSpec, hw: Hardware, proto: Plan, c: dict[str, np.ndarray], kind: str) -> dict:
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

