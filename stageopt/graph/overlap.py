"""Which kernels a collective can hide behind (communication overlap): TP with its GEMMs, ring CP with attention.

Two TP rules: userbuffer overlap (:func:`overlap_partners`, ``tp_overlap=on``)
and the asynchronous backward collectives every Megatron-Core linear layer
issues without it (:func:`async_backward_partners`).

Why a rule on the graph: Megatron-Core's TP overlap (Transformer Engine
userbuffers) pipelines the sequence-parallel all-gather into the GEMMs that
consume the gathered tensor, and the reduce-scatter out of the GEMM that
produces its input, chunk by chunk. How much it hides therefore depends on
the sizes of those GEMMs, which only the graph knows. The kernel pricing
(analytical, replay and trace durations alike) reads these pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

from stageopt.graph.tensor import Op

OVERLAPPED = ("all_gather", "reduce_scatter")
# TP collectives pipeline with their GEMMs; CP's K/V gathers and dK/dV scatters, run as a ring (p2p),
# with the attention kernel that reads or writes them (one K/V block per step).
PARTNER_KIND = {"tp": "matmul", "cp": "attention"}
# MoE dispatch all-to-all with the shared experts' kernels emitted right after it (moe_overlap).
SHARED_REGION = "shared_expert"


# Transformer Engine's userbuffer overlap runs the GEMM it pipelines as chunks (module/base.py, initialize_ub):
# the ring-exchange all-gather (QKV and FC1 forward, output projection and FC2 data gradients) as one GEMM per
# arriving chunk, tp of them; the forward reduce-scatter (output projection, FC2) with the ``pipeline`` method's
# default ``num_splits`` of 4; the backward reduce-scatters overlap a whole GEMM in bulk. Weight gradients are
# never split.
PIPELINE_SPLITS = 4


def userbuffer_chunks(kind: str, phase: str, tp):
    """How many GEMMs a TP collective's userbuffer overlap splits its partner GEMM into (1: not split)."""
    if kind == "all_gather":
        return tp
    if kind == "reduce_scatter" and phase in ("fwd", "recompute"):
        return PIPELINE_SPLITS
    return 1


def overlap_partners(ops: Sequence[Op]) -> dict[int, tuple[int, ...]]:
    """For each TP (and CP) all-gather / reduce-scatter (by position in ``ops``): its partner kernels' positions.

    An all-gather pairs with the matmuls that read its output; a
    reduce-scatter with the matmul that wrote its input.
    """
    producer = {t.uid: i for i, op in enumerate(ops) for t in op.outputs}
    out: dict[int, tuple[int, ...]] = {}
    for i, op in enumerate(ops):
        c = op.collective
        if op.kind == "comm" and c is not None and c.axis == "ep" and c.kind == "all_to_all":
            shared = tuple(j for j in range(i + 1, len(ops))
                           if ops[j].region == SHARED_REGION and ops[j].kind == "matmul")
            if shared:  # the dispatch runs while the shared experts compute (moe_overlap)
                out[i] = shared
            continue
        if op.kind != "comm" or c is None or c.axis not in PARTNER_KIND or c.kind not in OVERLAPPED:
            continue
        kind = PARTNER_KIND[c.axis]
        if c.kind == "all_gather":
            made = {t.uid for t in op.outputs}
            partners = tuple(j for j in range(i + 1, len(ops))
                             if ops[j].kind == kind and any(t.uid in made for t in ops[j].inputs))
        else:
            partners = gemm_producers(ops, producer, op.inputs[0].uid, kind)
        if partners:
            out[i] = partners
    return out


def gemm_producers(ops: Sequence[Op], producer: dict[int, int], uid: int, kind: str = "matmul") -> tuple[int, ...]:
    """Positions of the ``kind`` kernels that wrote tensor ``uid``: the one that wrote it, or those whose
    outputs an elementwise sum added into it (an input gradient summed over the GEMMs of a fused
    projection, as Q, K and V, which the stack computes as one GEMM)."""
    j = producer.get(uid)
    if j is None:
        return ()
    if ops[j].kind == kind:
        return (j,)
    if ops[j].kind != "vector":
        return ()
    parts = [gemm_producers(ops, producer, t.uid, kind) for t in ops[j].inputs]
    if parts and all(parts):  # a chain of sums over GEMM outputs only
        return tuple(sorted({p for part in parts for p in part}))
    return ()


def async_backward_partners(ops: Sequence[Op]) -> dict[int, tuple[int, ...]]:
    """For each backward TP collective the stack issues asynchronously: the GEMM it runs beside.

    Without userbuffers, Megatron-Core's and Transformer Engine's linear layers
    still launch two backward collectives on another stream (Transformer
    Engine's ``module/linear.py``): the all-gather of a sequence-parallel input
    saved as its shard runs while the data-gradient GEMM computes, and the
    reduce-scatter (all-reduce without sequence parallelism) of the input
    gradient while the weight-gradient GEMM computes. The partner recorded is
    the GEMM of the same linear layer with the same FLOPs: the weight-gradient
    GEMM that reads the re-gathered input, the data-gradient GEMM that wrote
    the gradient. Other backward collectives (the gather of a row-parallel
    output's gradient) feed both GEMMs and stay exposed.
    """
    producer = {t.uid: i for i, op in enumerate(ops) for t in op.outputs}
    out: dict[int, tuple[int, ...]] = {}
    for i, op in enumerate(ops):
        c = op.collective
        if op.kind != "comm" or c is None or c.axis != "tp" or op.phase != "bwd":
            continue
        if c.kind == "all_gather" and "regather_of" in op.attrs:
            made = {t.uid for t in op.outputs}
            partners = tuple(j for j in range(i + 1, len(ops))
                             if ops[j].kind == "matmul" and any(t.uid in made for t in ops[j].inputs))
        elif c.kind in ("reduce_scatter", "all_reduce"):
            partners = gemm_producers(ops, producer, op.inputs[0].uid)
        else:
            continue
        if partners:
            out[i] = partners
    return out
