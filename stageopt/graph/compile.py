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
from stageopt.graph.layout import PARTIAL
from stageopt.graph.symbols import ALL_SYMBOLS
from stageopt.graph.templates import Arch
from stageopt.graph.tensor import Op

PHASES = ("fwd", "bwd", "recompute")
COMPUTE_KINDS = ("matmul", "attention", "vector")


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective a block issues per micro-batch (sizes are looked up by ``index``)."""

    name: str
    phase: str
    kind: str
    axis: str
    index: int  # position of input_bytes in the value vector; output_bytes follows


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


def block_expressions(graph: BlockGraph) -> tuple[dict[str, sp.Expr], list[CollectiveSpec]]:
    exprs: dict[str, sp.Expr] = {}
    colls: list[CollectiveSpec] = []
    for phase in PHASES:
        ops = _phase_ops(graph, phase)
        exprs[f"{phase}_flops"] = _sum([op.flops for op in ops])
        exprs[f"{phase}_attn_flops"] = _sum([op.flops for op in ops if op.kind == "attention" or op.attrs.get("causal")])
        exprs[f"{phase}_vector_flops"] = _sum([op.vector_flops for op in ops])
        exprs[f"{phase}_bytes"] = _sum([op.bytes_read + op.bytes_written for op in ops])
        exprs[f"{phase}_vector_bytes"] = _sum([op.bytes_read + op.bytes_written for op in ops if op.kind == "vector"])
    names = list(exprs)
    for phase in PHASES:
        for op in _phase_ops(graph, phase):
            if op.collective is None:
                continue
            key = f"c{len(colls)}"
            exprs[f"{key}_in"] = op.collective.input_bytes
            exprs[f"{key}_out"] = op.collective.output_bytes
            colls.append(CollectiveSpec(op.name, phase, op.collective.kind, op.collective.axis, len(names)))
            names += [f"{key}_in", f"{key}_out"]
    acts = [t for t in graph.saved if t.role != "logits"]
    exprs["saved_bytes"] = _sum([t.local_bytes() for t in acts])
    exprs["logits_bytes"] = _sum([t.local_bytes() for t in graph.saved if t.role == "logits"])
    exprs["working_bytes"] = _sum([t.local_bytes() for t in graph.working_set if t.role != "logits"])
    exprs["boundary_bytes"] = graph.output.local_bytes() if graph.kind != "head" else sp.Integer(0)
    for group in ("dense", "expert"):
        ws = [w for w in graph.weights if w.param_group == group]
        exprs[f"params_{group}"] = _sum([w.global_numel() for w in ws if w.counted])
        exprs[f"local_{group}"] = _sum([w.local_numel() for w in ws])
        exprs[f"local_{group}_uncounted"] = _sum([w.local_numel() for w in ws if not w.counted])
        exprs[f"local_{group}_tp_partial"] = _sum([w.local_numel() for w, g in zip(graph.weights, graph.weight_grads)
                                                  if w.param_group == group and g.layout.get("tp") == PARTIAL])
    return exprs, colls


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
    """The kernel family a time model prices an op as: matmul, attention, attention_causal or vector."""
    if op.kind == "attention" and op.attrs.get("causal"):
        return "attention_causal"
    return op.kind


@dataclass(frozen=True)
class OpTable:
    """Per-op FLOPs and bytes of one block's compute ops, for kernel-level time models.

    ``kernels`` names each op's kernel family (:func:`kernel_name`), ``phases``
    uses PHASE_CODE; ``fn`` returns 2n values: n FLOP counts (tensor FLOPs for
    matmul/attention, vector FLOPs otherwise) then n byte counts, per rank and
    micro-batch.
    """

    kernels: tuple[str, ...]
    phases: np.ndarray
    fn: Callable[..., list]

    def evaluate(self, values: dict[str, object], size: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(flops, bytes) as arrays of shape (ops, size)."""
        out = self.fn(*[values[s.name] for s in ALL_SYMBOLS])
        rows = np.array([np.broadcast_to(np.asarray(x, dtype=float), (size,)) for x in out]).reshape(2, -1, size)
        return rows[0], rows[1]


@lru_cache(maxsize=64)
def compile_op_table(kind: str, arch: Arch, recompute: str) -> OpTable:
    graph = build_block(kind, arch, recompute)
    ops = [op for phase in PHASES for op in _phase_ops(graph, phase) if op.kind in COMPUTE_KINDS]
    flops = [op.flops if op.kind != "vector" else op.vector_flops for op in ops]
    nbytes = [op.bytes_read + op.bytes_written for op in ops]
    fn = sp.lambdify(ALL_SYMBOLS, flops + nbytes, modules="numpy", cse=False)
    return OpTable(kernels=tuple(kernel_name(op) for op in ops),
                   phases=np.array([PHASE_CODE[op.phase] for op in ops], dtype=int), fn=fn)
