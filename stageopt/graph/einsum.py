"""Layout rules for einsum-shaped ops (matmuls and attention).

On each parallel axis at most one index letter is split. The *driver* is the
first operand split on that axis, weights considered first: its split letter
decides. Every operand that has the letter must be split on it; the others
must be replicated. The output is split on the letter if it keeps it, and is a
partial sum if the letter is contracted away. This one rule yields Megatron's
column/row parallel linears, sequence/context parallel gathers and the
expert-parallel all-to-alls.
"""

from __future__ import annotations

import sympy as sp

from stageopt.errors import StageoptError
from stageopt.graph.layout import PARTIAL, REPLICATE, Layout, Placement, Split
from stageopt.graph.symbols import AXES, AXIS_DEGREE
from stageopt.graph.tensor import Tensor


def parse_spec(spec: str) -> tuple[list[str], str]:
    lhs, out = spec.replace(" ", "").split("->")
    return lhs.split(","), out


def letter_sizes(ins: list[str], operands: tuple[Tensor, ...]) -> dict[str, sp.Expr]:
    sizes: dict[str, sp.Expr] = {}
    for letters, tensor in zip(ins, operands):
        if len(letters) != len(tensor.shape):
            raise StageoptError(f"graph: einsum operand {tensor.name} has rank {len(tensor.shape)}, spec says {letters}")
        for letter, size in zip(letters, tensor.shape):
            sizes.setdefault(letter, size)
    return sizes


def required_layouts(ins: list[str], out: str, operands: tuple[Tensor, ...],
                     priority: tuple[int, ...]) -> tuple[list[Layout], Layout, dict[str, list[str]]]:
    """Input layouts the op needs, the output layout, and the split letters per axis."""
    req = [dict() for _ in operands]
    out_layout: dict[str, Placement] = {}
    split_by_axis: dict[str, list[str]] = {}
    for axis in AXES:
        driver = None
        for i in priority:
            placement = operands[i].layout.get(axis)
            if isinstance(placement, Split):
                driver = ins[i][placement.dim]
                break
        for i, letters in enumerate(ins):
            req[i][axis] = Split(letters.index(driver)) if driver and driver in letters else REPLICATE
        if driver is None:
            continue
        split_by_axis.setdefault(driver, []).append(axis)
        out_layout[axis] = Split(out.index(driver)) if driver in out else PARTIAL
    return [Layout.of(**r) for r in req], Layout.of(**out_layout), split_by_axis


def local_product(sizes: dict[str, sp.Expr], split_by_letter: dict[str, list[str]]) -> sp.Expr:
    """Product of every index's per-rank extent (2x this is the matmul's FLOPs)."""
    total = sp.Integer(1)
    for letter, size in sizes.items():
        for axis in split_by_letter.get(letter, ()):
            size = size / AXIS_DEGREE[axis]
        total *= size
    return total


def gemm_dims(ins: list[str], out: str, sizes: dict[str, sp.Expr],
              split_by_letter: dict[str, list[str]]) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
    """Per-rank (m, n, k, batch) of a two-operand einsum run as a (batched) GEMM.

    Output letters only in the first operand make ``m``, only in the second ``n``;
    contracted letters make ``k``; letters in both operands and the output are
    the batch. The kernel model counts tiles of ``m x n`` in waves over the SMs.
    """
    def extent(letters) -> sp.Expr:
        total = sp.Integer(1)
        for letter in letters:
            size = sizes[letter]
            for axis in split_by_letter.get(letter, ()):
                size = size / AXIS_DEGREE[axis]
            total *= size
        return total

    a, b = set(ins[0]), set(ins[1])
    m = [c for c in out if c in a and c not in b]
    n = [c for c in out if c in b and c not in a]
    batch = [c for c in out if c in a and c in b]
    k = [c for c in sizes if c not in out]
    return extent(m), extent(n), extent(k), extent(batch)
