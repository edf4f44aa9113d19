"""Kernel fusion: merge runs of elementwise ops into the one kernel a software stack launches.

Why a graph pass: which elementwise kernels exist is a property of the stack
(Megatron's fused bias-dropout-add and bias-activation, fused RoPE and
cross-entropy; torch.compile's generated kernels; plain eager PyTorch), not of
the model. Templates tag each vector op with the fusion group it belongs to;
this pass merges every run of consecutive ops carrying the same enabled tag
into one op that reads only what comes from outside the run and writes only
what something outside the run reads. The kernel model then prices the fused
op by those bytes and one launch, so fusion shows up in time, in the trace
nodes and in every backend alike. Saved activations (memory) are unaffected:
the fused kernels still write what backward needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sympy as sp

from stageopt.frameworks.profile import FUSION_GROUPS  # noqa: F401  (the tags a stack may enable)
from stageopt.graph.tensor import Op



def _merge(run: Sequence[Op], keep: set[int]) -> Op:
    produced = {t.uid for op in run for t in op.outputs}
    inputs, seen = [], set()
    for op in run:
        for t in op.inputs:
            if t.uid not in produced and t.uid not in seen:
                seen.add(t.uid)
                inputs.append(t)
    outputs = tuple(t for op in run for t in op.outputs if t.uid in keep)
    first = run[0]
    return Op(name="+".join(op.name for op in run), kind="vector", inputs=tuple(inputs),
              outputs=outputs or run[-1].outputs, vector_flops=sp.Add(*[op.vector_flops for op in run]),
              phase=first.phase, region=first.region,
              attrs={**{k: v for k, v in first.attrs.items() if k not in ("kernels", "random")},
                     "fused": tuple(op.name for op in run),
                     **({"random": True} if any(op.attrs.get("random") for op in run) else {})})


def fuse_ops(ops: Sequence[Op], enabled: Iterable[str], keep: set[int]) -> tuple[Op, ...]:
    """``ops`` with every run of consecutive vector ops of one enabled fusion group merged.

    ``keep`` holds the tensors that must be written even when only the run
    itself reads them (saved for backward, block outputs, weight gradients).
    """
    enabled = frozenset(enabled)
    read_by: dict[int, set[int]] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            read_by.setdefault(t.uid, set()).add(i)
    def tag(op: Op) -> str | None:
        if op.kind != "vector":
            return None
        return "all" if "all" in enabled else op.attrs.get("fuse")

    out: list[Op] = []
    i = 0
    while i < len(ops):
        group = tag(ops[i])
        j = i + 1
        while group in enabled and j < len(ops) and tag(ops[j]) == group:
            j += 1
        if j - i > 1:
            members = set(range(i, j))
            outside = {t.uid for k in range(i, j) for t in ops[k].outputs
                       if t.uid in keep or read_by.get(t.uid, set()) - members}
            out.append(_merge(ops[i:j], outside))
        elif ops[i].kind == "vector" and group not in enabled:
            out.append(_eager(ops[i]))
        else:
            out.append(ops[i])
        i = j
    return tuple(out)


def _eager(op: Op) -> Op:
    """An op no fusion covers: it runs as eager PyTorch launches it (``eager_passes`` kernels)."""
    passes = op.attrs.get("eager_passes", 1.0)
    if passes == 1.0:
        return op
    return Op(name=op.name, kind=op.kind, inputs=op.inputs, outputs=op.outputs, flops=op.flops,
              vector_flops=op.vector_flops, phase=op.phase, region=op.region, attrs={**op.attrs, "passes": passes})


GEMM_AXES = {"": 1, "dgrad": 2, "wgrad": 0}  # the GEMM dimension fused members concatenate (m 0, n 1, k 2)


def group_label(first: int, axis: int) -> int:
    """A fused GEMM's label: its first member's position (or node id) and the axis its members join on."""
    return 4 * first + axis


def gemm_groups(ops: Sequence[Op], enabled: Iterable[str]) -> list[int]:
    """For each op, the label of the fused GEMM it belongs to (-1: not part of one).

    Matmuls tagged with an enabled ``gemm_group`` (``qkv``, ``fc1``, ``expert_fc1``, which ``fc1`` implies;
    their backward data- and weight-gradient GEMMs carry ``qkv/dgrad`` etc.) run as one GEMM per
    phase, their output columns (forward), contracted columns (data gradient) or
    output rows (weight gradient) concatenated; the kernel model prices the group
    as that GEMM and shares its time out by FLOPs. Labels are :func:`group_label`.
    """
    enabled = frozenset(enabled) | ({"expert_fc1"} if "fc1" in enabled else set())  # fc1 covers the experts' too
    first: dict[tuple[str, str], int] = {}
    out = []
    for i, op in enumerate(ops):
        tag = op.attrs.get("gemm_group") if op.kind == "matmul" else None
        if tag and tag.split("/")[0] in enabled:
            part = tag.split("/")[1] if "/" in tag else ""
            out.append(group_label(first.setdefault((op.phase, tag), i), GEMM_AXES[part]))
        else:
            out.append(-1)
    return out
