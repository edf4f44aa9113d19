"""Compile a block's symbolic costs once into a numpy function.

Every number the analytical model, ``inspect`` and memory need from a block is
one entry of a flat expression list, lambdified together, so evaluating a new
plan (or a batch of them, with array arguments) costs one call per block.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import sympy as sp

from stageopt.graph.block import BlockGraph, build_block
from stageopt.graph.fusion import gemm_groups
from stageopt.graph.layout import PARTIAL
from stageopt.graph.overlap import async_backward_partners, overlap_partners
from stageopt.graph.symbols import ALL_SYMBOLS
from stageopt.graph.templates import Arch
from stageopt.graph.tensor import Op
from stageopt.model.layer_types import HEAD_KINDS

PHASES = ("fwd", "bwd", "recompute")
COMPUTE_KINDS = ("matmul", "attention", "vector")
# Bytes an element of the low-precision copy a GEMM keeps for its weight gradient: FP8, and NVFP4's 4-bit
# value with one E4M3 scale per 16 elements.
LOW_PRECISION_SAVED = {"fp8": sp.Integer(1), "nvfp4": sp.Rational(9, 16)}


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective a block issues per micro-batch (sizes are looked up by ``index``)."""

    name: str
    phase: str
    kind: str
    axis: str
    index: int  # position of input_bytes in the value vector; output_bytes follows
    hides: tuple[int, ...] = ()  # op-table rows of the GEMMs it can overlap (stageopt.graph.overlap)
    async_hides: tuple[int, ...] = ()  # op-table rows of the GEMM it runs beside when issued asynchronously


@dataclass(frozen=True)
class CompiledBlock:
    kind: str
    names: tuple[str, ...]
    collectives: tuple[CollectiveSpec, ...]
    op_counts: dict[str, int]  # compute ops per phase (structure; same for every plan)
    fn: Callable[..., list]

    def evaluate(self, values: dict[str, object]) -> dict[str, object]:
        """Numbers for concrete symbol values (scalars or equal-length arrays)."""
        out = self.fn(*[values[s.name] for s in ALL_SYMBOLS])
        return dict(zip(self.names, out))


def _sum(exprs) -> sp.Expr:
    return sp.Add(*exprs) if exprs else sp.Integer(0)


def _phase_ops(graph: BlockGraph, phase: str) -> tuple[Op, ...]:
    return {"fwd": graph.fwd, "bwd": graph.bwd, "recompute": graph.recompute}[phase]


def saved_bytes_key(plan) -> str:
    """The aggregate holding a block's saved activations under ``plan``.

    FP8 training on Transformer Engine saves each FP8 GEMM's input as its
    1-byte FP8 copy (its Linear and GroupedLinear keep the quantized input,
    column-wise, for the weight gradient); a tensor another backward op also
    reads keeps its high-precision form beside it. A stack whose FP8 GEMMs
    keep the high-precision input and cast it again in backward (torchao's
    Float8Linear) saves what bf16 training saves (``fp8_saves_inputs``).
    Transformer Engine's NVFP4 recipe keeps the NVFP4 copy likewise (4.5 bits
    an element with its block scales).
    """
    if plan.dtype in LOW_PRECISION_SAVED and plan.framework.fp8_saves_inputs:
        return f"saved_bytes_{plan.dtype}"
    return "saved_bytes"


def block_expressions(graph: BlockGraph) -> tuple[dict[str, sp.Expr], list[CollectiveSpec]]:
    exprs: dict[str, sp.Expr] = {}
    colls: list[CollectiveSpec] = []
    for phase in PHASES:
        ops = _phase_ops(graph, phase)
        exprs[f"{phase}_flops"] = _sum([op.flops for op in ops])
        exprs[f"{phase}_attn_flops"] = _sum([op.flops for op in ops if op.kind == "attention" or op.attrs.get("causal")])
        exprs[f"{phase}_vector_flops"] = _sum([op.vector_flops for op in ops])
        exprs[f"{phase}_bytes"] = _sum([op.kernel_bytes for op in ops])
        exprs[f"{phase}_vector_bytes"] = _sum([op.kernel_bytes for op in ops if op.kind == "vector"])
    exprs["wgrad_flops"] = _sum([op.flops for op in graph.w_ops()])
    exprs["wgrad_held_bytes"] = _sum([t.local_bytes() for t in wgrad_inputs(graph)])
    names = list(exprs)
    row = {id(op): r for r, op in enumerate(op for ph in PHASES for op in _phase_ops(graph, ph)
                                            if op.kind in COMPUTE_KINDS)}
    for phase in PHASES:
        ops = _phase_ops(graph, phase)
        partners, beside = overlap_partners(ops), async_backward_partners(ops)
        for i, op in enumerate(ops):
            if op.collective is None:
                continue
            key = f"c{len(colls)}"
            exprs[f"{key}_in"] = op.collective.input_bytes
            exprs[f"{key}_out"] = op.collective.output_bytes
            hides = tuple(row[id(ops[j])] for j in partners.get(i, ()))
            async_hides = tuple(row[id(ops[j])] for j in beside.get(i, ()))
            colls.append(CollectiveSpec(op.name, phase, op.collective.kind, op.collective.axis, len(names), hides,
                                        async_hides))
            names += [f"{key}_in", f"{key}_out"]
    acts = [t for t in graph.saved if t.role != "logits"]
    exprs["saved_bytes"] = _sum([t.local_bytes() for t in acts])
    for dtype, copy_bytes in LOW_PRECISION_SAVED.items():
        exprs[f"saved_bytes_{dtype}"] = _sum([(0 if t.uid in graph.fp8_only else t.local_bytes())
                                              + (copy_bytes * t.local_numel() if t.uid in graph.fp8_saved else 0)
                                              for t in acts])
    exprs["logits_bytes"] = _sum([t.local_bytes() for t in graph.saved if t.role == "logits"])
    exprs["working_bytes"] = _sum([t.local_bytes() for t in graph.working_set if t.role != "logits"])
    exprs["boundary_bytes"] = graph.output.local_bytes() if graph.kind not in HEAD_KINDS else sp.Integer(0)
    for group in ("dense", "expert"):
        ws = [w for w in graph.weights if w.param_group == group]
        exprs[f"params_{group}"] = _sum([w.global_numel() for w in ws if w.counted])
        exprs[f"local_{group}"] = _sum([w.local_numel() for w in ws])
        exprs[f"local_{group}_uncounted"] = _sum([w.local_numel() for w in ws if not w.counted])
        exprs[f"local_{group}_tp_partial"] = _sum([w.local_numel() for w, g in zip(graph.weights, graph.weight_grads)
                                                  if w.param_group == group and g.layout.get("tp") == PARTIAL])
    return exprs, colls


def wgrad_inputs(graph: BlockGraph) -> list:
    """Tensors the weight-gradient pass reads that the input-gradient pass leaves behind.

    What a zero-bubble schedule keeps between a micro-batch's I and W passes:
    the saved inputs of the weight GEMMs and the output gradients they read. A
    gradient the I pass all-gathered (sequence parallelism) is kept as its
    shard, as forward activations are; the W pass re-gathers it (that gather's
    time is not charged: a stated approximation).
    """
    w_ops = graph.w_ops()
    made = {t.uid for op in w_ops for t in op.outputs}
    gathered = {op.outputs[0].uid: op.inputs[0] for op in graph.bwd
                if op.collective is not None and op.collective.kind == "all_gather"}
    found: dict[int, object] = {}
    for op in w_ops:
        for t in op.inputs:
            if t.role != "weight" and t.uid not in made:
                t = gathered.get(t.uid, t)
                found[t.uid] = t
    return list(found.values())


@lru_cache(maxsize=64)
def compile_block(kind: str, arch: Arch, recompute: str) -> CompiledBlock:
    graph = build_block(kind, arch, recompute)
    exprs, colls = block_expressions(graph)
    names = tuple(exprs)
    fn = sp.lambdify(ALL_SYMBOLS, [exprs[n] for n in names], modules="numpy", cse=False)
    counts = {phase: sum(op.kind in COMPUTE_KINDS for op in _phase_ops(graph, phase)) for phase in PHASES}
    return CompiledBlock(kind=kind, names=names, collectives=tuple(colls), op_counts=counts, fn=fn)


def as_array(x: object) -> np.ndarray:
    return np.asarray(x, dtype=float)


PHASE_CODE = {"fwd": 0, "bwd": 1, "recompute": 2}


def kernel_name(op: Op) -> str:
    """The kernel family a time model prices an op as: matmul, attention, attention_causal, vector or
    vector_random (an elementwise kernel that draws a random number per element: dropout)."""
    if op.kind == "attention" and op.attrs.get("causal"):
        return "attention_causal"
    if op.kind == "vector" and op.attrs.get("random"):
        return "vector_random"
    return op.kind


GEMM_FIELDS = ("m", "n", "k", "batch", "cast")  # "cast": elements a low-precision GEMM casts (builder.einsum)


def gemm_shape(op: Op) -> tuple[sp.Expr, ...]:
    """Per-rank (m, n, k, batch, cast) of a matmul op; (0, keys per mask edge, FLOPs per score, 0, 0) of an
    attention op (:func:`stageopt.graph.tensor.score_shape`); zeros for other kernels (priced by FLOPs or bytes)."""
    return tuple(op.attrs.get("gemm", (sp.Integer(0),) * len(GEMM_FIELDS)))


@dataclass(frozen=True)
class OpTable:
    """Per-op numbers of one block's compute ops, for the kernel model.

    ``kernels`` names each op's kernel family (:func:`kernel_name`), ``phases``
    uses PHASE_CODE, ``precision`` the kernel model's precision class; ``fn``
    returns 8n values per rank and micro-batch: n FLOP counts (tensor FLOPs for
    matmul/attention, vector FLOPs otherwise), n byte counts, the GEMM shape
    rows m, n, k, batch and cast (zero for non-GEMM kernels), then n kernel
    counts (:attr:`~stageopt.graph.tensor.Op.launch_count`: a loop over the
    rank's local experts depends on ep).
    """

    kernels: tuple[str, ...]
    phases: np.ndarray
    precision: np.ndarray
    groups: np.ndarray  # fused GEMM of each op: row of its first member, -1 for none (graph.fusion)
    fn: Callable[..., list]
    wgrad: np.ndarray | None = None  # bool per op: part of the weight-gradient (W) pass

    def evaluate(self, values: dict[str, object], size: int = 1) -> dict[str, np.ndarray]:
        """Rows ``flops``, ``bytes``, ``m``, ``n``, ``k``, ``batch``, ``cast``, ``launches`` as arrays of shape
        (ops, size)."""
        out = self.fn(*[values[s.name] for s in ALL_SYMBOLS])
        rows = np.empty((len(out), size))
        for i, x in enumerate(out):
            rows[i] = x
        rows = rows.reshape(3 + len(GEMM_FIELDS), -1, size)
        return dict(zip(("flops", "bytes", *GEMM_FIELDS, "launches"), rows))


@lru_cache(maxsize=64)
def compile_op_table(kind: str, arch: Arch, recompute: str) -> OpTable:
    graph = build_block(kind, arch, recompute)
    ops = [op for phase in PHASES for op in _phase_ops(graph, phase) if op.kind in COMPUTE_KINDS]
    w_ids = {id(op) for op in graph.w_ops()}
    flops = [op.flops if op.kind != "vector" else op.vector_flops for op in ops]
    nbytes = [op.kernel_bytes for op in ops]
    shapes = [gemm_shape(op)[i] for i in range(len(GEMM_FIELDS)) for op in ops]
    launches = [op.launch_count for op in ops]
    fn = sp.lambdify(ALL_SYMBOLS, flops + nbytes + shapes + launches, modules="numpy", cse=False)
    return OpTable(kernels=tuple(kernel_name(op) for op in ops),
                   phases=np.array([PHASE_CODE[op.phase] for op in ops], dtype=int),
                   precision=np.array([op.attrs.get("precision", 0) for op in ops], dtype=int),
                   groups=np.array(gemm_groups(ops, arch.fusions), dtype=int), fn=fn,
                   wgrad=np.array([id(op) in w_ids for op in ops], dtype=bool))
