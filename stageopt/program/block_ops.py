"""Per-op costs of one block: the kernels and collectives a trace node stands for.

:mod:`stageopt.graph.compile` lambdifies a block's *aggregates* for fast
evaluation over many candidate plans; a trace needs every op separately (one
node per kernel or collective) but for one plan only. So this module collects
the per-op expressions once per (block kind, arch, recompute) and evaluates
them by substituting integers: exact rational arithmetic (an integer FLOP or
byte count stays exact), and about 30x cheaper than lambdifying for a single
evaluation. Next to the expressions it keeps the structure the program
builder walks: which tensors an op reads and writes (data dependencies follow
from which op produced each input) and which weight groups it reads (ZeRO-3
gathers).

Views and reshards that move no data become ``alias`` ops: they produce no
node, their outputs simply stand for their inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import sympy as sp

from stageopt.graph.block import BlockGraph, build_block
from stageopt.graph.compile import gemm_shape, kernel_name
from stageopt.graph.fusion import gemm_groups
from stageopt.graph.overlap import async_backward_partners, overlap_partners
from stageopt.graph.symbols import ALL_SYMBOLS
from stageopt.graph.templates import Arch
from stageopt.graph.tensor import Op

COMPUTE_KINDS = ("matmul", "attention", "vector")


@dataclass(frozen=True, slots=True)
class OpShape:
    """One op of a block phase, without numbers (those come from :class:`BlockOps.evaluate`).

    ``kind``: ``comp`` (a kernel), ``coll`` (a collective on ``axis``) or
    ``alias`` (a view or data-free reshard). ``values`` indexes the evaluated
    vector: comp -> (num_ops, tensor_size, m, n, k, batch, cast, kernels), coll -> (input bytes, output bytes).
    """

    name: str
    phase: str  # fwd | bwd | recompute
    kind: str
    collective: str  # all_reduce | all_gather | reduce_scatter | all_to_all ("" unless coll)
    axis: str  # tp | cp | ep ("" unless coll)
    inputs: tuple[int, ...]  # tensor uids read (weights excluded)
    weight_groups: tuple[str, ...]  # param groups of the weights read ("dense", "expert")
    outputs: tuple[int, ...]
    values: int
    kernel: str = ""  # comp: matmul | attention | attention_causal | vector
    precision: int = 0  # comp: the kernel model's precision class (stageopt.hardware.kernels)
    hides: tuple[int, ...] = ()  # coll: positions (in the same phase tuple) of the GEMMs it overlaps
    async_hides: tuple[int, ...] = ()  # coll: position of the GEMM it runs beside when issued asynchronously
    group: int = -1  # comp: its fused GEMM's label (graph.fusion.gemm_groups: first position and join axis)
    wgrad: bool = False  # backward op of the weight-gradient (W) pass


@dataclass(frozen=True)
class BlockOps:
    """A block's ops per step kind: ``forward`` for F, ``backward`` (recompute, then bwd) for B.

    ``*_exits`` are the tensors the next block of the same step consumes: the
    block output going forward, the gradient of the block input going backward.
    """

    kind: str
    forward: tuple[OpShape, ...]
    backward: tuple[OpShape, ...]
    forward_exits: tuple[int, ...]
    backward_exits: tuple[int, ...]
    exprs: tuple[sp.Expr, ...]

    def evaluate(self, symbols: dict[str, float]) -> np.ndarray:
        """Every op's numbers for concrete (integer) symbol values, rounded to integers (FLOPs, bytes)."""
        subs = {s: sp.Integer(int(symbols[s.name])) for s in ALL_SYMBOLS}
        return np.array([int(round(e.xreplace(subs))) for e in self.exprs], dtype=np.int64)


def _shape(op: Op, phase: str, index: int, wgrad: bool) -> OpShape:
    inputs = tuple(t.uid for t in op.inputs if t.role != "weight")
    groups = tuple(sorted({t.param_group for t in op.inputs if t.role == "weight"}))
    outputs = tuple(t.uid for t in op.outputs)
    if op.kind in COMPUTE_KINDS:
        return OpShape(op.name, phase, "comp", "", "", inputs, groups, outputs, index, kernel_name(op),
                       op.attrs.get("precision", 0), wgrad=wgrad)
    if op.kind == "comm" and op.collective is not None:
        c = op.collective
        return OpShape(op.name, phase, "coll", c.kind, c.axis, inputs, groups, outputs, index, wgrad=wgrad)
    return OpShape(op.name, phase, "alias", "", "", inputs, groups, outputs, -1, wgrad=wgrad)


def _values(op: Op) -> tuple[sp.Expr, ...]:
    """comp: FLOPs, bytes, the GEMM shape (m, n, k, batch, cast), then the kernel count; coll: input and
    output bytes."""
    if op.kind in COMPUTE_KINDS:
        return (op.flops + op.vector_flops, op.kernel_bytes, *gemm_shape(op), op.launch_count)
    assert op.collective is not None
    return op.collective.input_bytes, op.collective.output_bytes


def _backward_exits(graph: BlockGraph) -> tuple[int, ...]:
    """Gradients produced in backward and read by no later backward op, other than weight gradients."""
    ops = graph.recompute + graph.bwd
    read = {t.uid for op in ops for t in op.inputs}
    wgrads = {t.uid for t in graph.weight_grads}
    return tuple(t.uid for op in ops for t in op.outputs
                 if t.uid not in read and t.uid not in wgrads and t.role == "grad")


@lru_cache(maxsize=64)
def block_ops(kind: str, arch: Arch, recompute: str) -> BlockOps:
    """Collect one block's per-op expressions (cached: the same block serves every plan)."""
    graph = build_block(kind, arch, recompute)
    exprs: list[sp.Expr] = []

    w_ids = {id(op) for op in graph.w_ops()}

    def phase_ops(ops: tuple[Op, ...]) -> tuple[OpShape, ...]:
        out = []
        partners, beside = overlap_partners(ops), async_backward_partners(ops)
        groups = gemm_groups(ops, arch.fusions)
        for i, op in enumerate(ops):
            shape = _shape(op, op.phase, len(exprs), id(op) in w_ids)
            if shape.kind != "alias":
                exprs.extend(_values(op))
            if i in partners:
                shape = dataclasses.replace(shape, hides=partners[i])
            if i in beside:
                shape = dataclasses.replace(shape, async_hides=beside[i])
            if groups[i] >= 0:
                shape = dataclasses.replace(shape, group=groups[i])
            out.append(shape)
        return tuple(out)

    forward = phase_ops(graph.fwd)
    backward = phase_ops(graph.recompute + graph.bwd)
    return BlockOps(kind=kind, forward=forward, backward=backward, forward_exits=(graph.output.uid,),
                    backward_exits=_backward_exits(graph), exprs=tuple(exprs))
