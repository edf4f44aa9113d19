"""Tensors and ops of the symbolic graph."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import sympy as sp

from stageopt.graph.layout import Layout
from stageopt.graph.symbols import AXIS_DEGREE, EP, E

_ids = itertools.count()


@dataclass(frozen=True, eq=False, slots=True)
class Tensor:
    """A tensor with a symbolic global shape and a layout.

    ``role`` is one of: activation, weight, grad, wgrad, mask, logits, input.
    Weights carry ``param_group`` ("dense" or "expert": which data-parallel
    group reduces their gradients) and ``counted`` (False for the second copy
    of a tied embedding).
    """

    name: str
    shape: tuple[sp.Expr, ...]
    layout: Layout
    dtype_bytes: int
    role: str = "activation"
    param_group: str = ""
    counted: bool = True
    uid: int = field(default_factory=lambda: next(_ids))

    def local_dim(self, dim: int) -> sp.Expr:
        size = self.shape[dim]
        for axis in self.layout.split_axes(dim):
            size = size / AXIS_DEGREE[axis]
        return size

    def local_numel(self) -> sp.Expr:
        return sp.Mul(*[self.local_dim(i) for i in range(len(self.shape))])

    def global_numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)

    def local_bytes(self) -> sp.Expr:
        return self.local_numel() * self.dtype_bytes

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.layout!r})"


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective on one parallel axis; sizes are bytes per rank."""

    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all
    axis: str
    input_bytes: sp.Expr
    output_bytes: sp.Expr

    @property
    def size_bytes(self) -> sp.Expr:
        """The buffer size a collective is usually quoted by: the larger side."""
        return sp.Max(self.input_bytes, self.output_bytes) if self.kind != "all_reduce" else self.input_bytes


def score_shape(flops_per_score: sp.Expr, keys_per_row: sp.Expr = sp.Integer(0),
                edges: sp.Expr = sp.Integer(0)) -> tuple[sp.Expr, ...]:
    """The ``gemm`` attribute of a flash-attention op: (mask edges, keys per query row, FLOPs per score, 0, 0).

    A fused attention kernel has no GEMM shape of its own; its ``k`` slot carries
    the FLOPs it spends per query-key score (4 x head dim forward), so the kernel
    model counts the exponentials its softmax computes as ``flops / k``. Its ``n``
    slot carries the keys one kernel call visits per query row (``S / 2`` for
    causal attention over ``S`` keys; 0: not given), from which the kernel model
    counts the kernel's tiles (``KernelEfficiency.tile_us``), and its ``m`` slot the
    mask edges a row meets per call (1 causal, 2 for a sliding window), whose
    blocks are computed whole (``GpuEfficiency.attention_tile``).
    """
    zero = sp.Integer(0)
    return (sp.sympify(edges), sp.sympify(keys_per_row), sp.sympify(flops_per_score), zero, zero)


def backward_score_shape(forward: "Op") -> tuple[sp.Expr, ...]:
    """The backward kernel's scores are the forward's (each recomputed once), over twice its model FLOPs."""
    fwd = forward.attrs.get("gemm")
    return score_shape(2 * fwd[2], fwd[1], fwd[0]) if fwd is not None else (sp.Integer(0),) * 5


@dataclass(eq=False, slots=True)
class Op:
    """One kernel (or collective) of the graph.

    ``kind``: matmul | attention | vector | comm | view. ``flops`` counts
    tensor-core work (2 per multiply-add); ``vector_flops`` the rest.
    ``needs`` lists the forward tensors the op's backward reads.
    """

    name: str
    kind: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    flops: sp.Expr = sp.Integer(0)
    vector_flops: sp.Expr = sp.Integer(0)
    collective: Collective | None = None
    phase: str = "fwd"
    region: str = ""
    attrs: dict = field(default_factory=dict)

    @property
    def launches(self) -> int:
        """Kernels this op stands for (more than one for an elementwise op eager PyTorch splits)."""
        return math.ceil(self.attrs.get("passes", 1.0))

    @property
    def launch_count(self) -> sp.Expr:
        """:attr:`launches` as the plan sets it: an op that loops over the rank's local experts in Python
        (attr ``kernels`` = (fixed, per local expert)) launches fixed + per x E / ep kernels."""
        kernels = self.attrs.get("kernels")
        if kernels is None:
            return sp.Integer(self.launches)
        fixed, per_expert = kernels
        return sp.Integer(fixed) + per_expert * E / EP

    @property
    def kernel_bytes(self) -> sp.Expr:
        """HBM bytes its kernels move: what it reads and writes, once per pass."""
        passes = self.attrs.get("passes", 1.0)
        moved = self.bytes_read + self.bytes_written
        return moved * sp.nsimplify(passes) if passes != 1.0 else moved

    @property
    def bytes_read(self) -> sp.Expr:
        return sp.Add(*[t.local_bytes() for t in self.inputs]) if self.kind not in ("comm", "view") else sp.Integer(0)

    @property
    def bytes_written(self) -> sp.Expr:
        return sp.Add(*[t.local_bytes() for t in self.outputs]) if self.kind not in ("comm", "view") else sp.Integer(0)
