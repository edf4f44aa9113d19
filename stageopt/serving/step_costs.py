"""Per-op numbers of the serving blocks, compiled once and evaluated for any step shape.

A serving step mixes sequences that bring different numbers of new tokens
(prefill chunks, one token per decode) against different cached contexts. The
block graphs are written in the symbols ``B`` (sequences), ``S`` (new tokens
each) and ``T`` (keys each attends to); every cost is multilinear in them, so a
whole step is evaluated as one sequence of ``S = N`` new tokens (``N`` the
step's tokens) with ``T`` set per quantity: query-key pairs / N for attention
FLOPs, the keys read for KV-cache bytes. Bytes are kept in three parts --
weights, KV cache and activations -- because a serving plan's weight dtype
scales the first, and decode is bound by the first two.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import sympy as sp

from stageopt.graph.compile import gemm_shape, kernel_name
from stageopt.graph.fusion import gemm_groups
from stageopt.graph.symbols import ALL_SYMBOLS, AXIS_DEGREE
from stageopt.graph.templates import Arch
from stageopt.graph.tensor import Op, Tensor
from stageopt.serving.cache_graph import T, serving_block

SYMBOLS = ALL_SYMBOLS + (T,)
ROWS = 8
COMPUTE = ("matmul", "attention", "vector")


@dataclass(frozen=True)
class OpRow:
    """One kernel or collective of a serving block."""

    name: str
    kind: str  # matmul | attention | vector | comm
    collective: str  # comm only: all_reduce | all_gather | reduce_scatter | all_to_all
    axis: str  # comm only: tp | ep
    expert: bool  # reads expert weights (only the experts a step's tokens reach are read)
    precision: int  # the kernel model's precision class (0: stays high precision)
    launches: float  # kernels the op launches (eager elementwise ops launch several)
    group: int = -1  # matmul: row of the first GEMM of its fused GEMM (fused QKV, gate+up), -1 for none


@dataclass(frozen=True)
class BlockTable:
    """A block's ops and a function giving, per op, FLOPs, weight, cache and activation bytes, and GEMM m, n, k, batch."""

    kind: str
    rows: tuple[OpRow, ...]
    fn: Callable[..., list]

    def evaluate(self, values: dict[str, object], size: int) -> np.ndarray:
        """Array (8, ops, size): FLOPs, weight, cache and activation bytes (comm: its size in row 3),
        then the GEMM shape m, n, k, batch (zero for other kernels)."""
        out = self.fn(*[values[s.name] for s in SYMBOLS])
        rows = np.array([np.broadcast_to(np.asarray(x, dtype=float), (size,)) for x in out])
        return rows.reshape(ROWS, len(self.rows), size)


def _bytes_by_role(tensors: tuple[Tensor, ...], role: str | None) -> sp.Expr:
    picked = [t.local_bytes() for t in tensors if (t.role == role if role else t.role not in ("weight", "kv_cache"))]
    return sp.Add(*picked) if picked else sp.Integer(0)


def _op_values(op: Op) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
    if op.kind == "comm":
        c = op.collective
        size = c.output_bytes if c.kind == "all_gather" else c.input_bytes
        return sp.Integer(0), sp.Integer(0), sp.Integer(0), size
    flops = op.flops if op.kind != "vector" else op.vector_flops
    weights = _bytes_by_role(op.inputs, "weight")
    acts = _bytes_by_role(op.inputs, None) + _bytes_by_role(op.outputs, None)
    if op.kind == "vector" and weights != 0 and op.vector_flops == 0:
        weights = _bytes_by_role(op.outputs, None)  # a gather (embedding) reads only the rows it outputs
    cache = _bytes_by_role(op.inputs, "kv_cache") + _bytes_by_role(op.outputs, "kv_cache")
    return flops, weights, cache, acts


@lru_cache(maxsize=32)
def block_table(kind: str, arch: Arch) -> BlockTable:
    block = serving_block(kind, arch)
    ops = [op for op in block.ops if op.kind in COMPUTE or (op.kind == "comm" and op.collective is not None)]
    rows = tuple(OpRow(name=op.name, kind=kernel_name(op) if op.kind in COMPUTE else "comm",
                       collective=op.collective.kind if op.collective else "",
                       axis=op.collective.axis if op.collective else "",
                       expert=any(t.param_group == "expert" for t in op.inputs if t.role == "weight"),
                       precision=int(op.attrs.get("precision", 0)), launches=float(op.attrs.get("passes", 1.0)),
                       group=group)
                 for op, group in zip(ops, gemm_groups(ops, arch.fusions)))
    values = [_op_values(op) + gemm_shape(op) for op in ops]
    exprs = [sp.sympify(v[i]) for i in range(ROWS) for v in values]
    return BlockTable(kind=kind, rows=rows, fn=sp.lambdify(SYMBOLS, exprs, modules="numpy", cse=False))


def _dim_value(expr: sp.Expr, values: dict[str, float]) -> float:
    return float(expr.subs({s: values[s.name] for s in expr.free_symbols}))


def cache_bytes_per_token(arch: Arch, values: dict[str, float], kinds: tuple[str, ...] = ("attention",)) -> float:
    """KV-cache bytes one rank holds per cached token of one layer.

    Read from the cache tensors of the attention block: each split dimension
    holds ``max(size / degree, 1)`` entries per rank, because engines replicate
    key/value heads when TP exceeds their number rather than split a head.
    """
    total = 0.0
    for kind in kinds:
        for t in serving_block(kind, arch).cache:
            elems = 1.0
            for dim, size in enumerate(t.shape[2:], start=2):
                extent = _dim_value(size, values)
                for axis in t.layout.split_axes(dim):
                    extent = max(extent / float(values[AXIS_DEGREE[axis].name]), 1.0)
                elems *= extent
            total += elems * t.dtype_bytes
    return total


def block_weight_params(kind: str, arch: Arch, values: dict[str, float]) -> tuple[float, float]:
    """(dense, expert) parameters one rank holds for one block."""
    dense = expert = 0.0
    seen: set[int] = set()
    for op in serving_block(kind, arch).ops:
        for t in op.inputs:
            if t.role == "weight" and t.uid not in seen and t.counted:
                seen.add(t.uid)
                n = _dim_value(t.local_numel(), values)
                if t.param_group == "expert":
                    expert += n
                else:
                    dense += n
    return dense, expert
