"""Which kernels a collective can hide behind (communication overlap): TP with its GEMMs, ring CP with attention.

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
            j = producer.get(op.inputs[0].uid)
            partners = (j,) if j is not None and ops[j].kind == kind else ()
        if partners:
            out[i] = partners
    return out
