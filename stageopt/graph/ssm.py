"""Mamba-2 layers (Dao and Gu 2024, state space duality): the block template.

Why a template of its own: a Mamba-2 mixer has no attention. Its input
projection makes, per head, a gate ``z`` and the inputs ``x``, per group the
``B`` and ``C`` projections, and per head a step ``dt``; a short causal
convolution runs over x, B and C; the state-space-duality (SSD) algorithm then
cuts the sequence into chunks of ``ssm_chunk`` tokens and computes, per chunk,
``C B^T`` (a chunk-by-chunk attention-like matrix, masked by the decays),
its product with x, the chunk's contribution to the state (``B^T x``) and the
output from the previous state (``C state``). FLOPs per token and head are
``2 Q N`` (within groups), ``2 Q P``, ``2 P N`` and ``2 P N`` for chunk length
Q, state N and head dimension P: linear in the sequence, unlike attention.

Sharding follows Megatron-Core's Mamba mixer: the input projection is
column-parallel over heads and groups (tp must divide both), the output
projection row-parallel; convolution, SSD and the gated norm are local to a
rank's heads. Context parallelism is not modelled for these layers.
"""

from __future__ import annotations

from stageopt.graph.builder import GraphBuilder
from stageopt.graph.layout import Layout, Split
from stageopt.graph.symbols import SC, SG, SH, SN, SP, SQ, B, H, S
from stageopt.graph.tensor import Tensor
from stageopt.graph.templates import Arch, _norm, _residual_add, weight


def _chunked(b: GraphBuilder, name: str, t: Tensor, per_group: bool) -> Tensor:
    """(B, S, heads or groups, ...) -> (B, S/Q, Q, groups[, heads per group], ...): sequence cut into chunks."""
    if per_group:  # (B, S, SG, SN) -> (B, S/SQ, SQ, SG, SN)
        return b.view(name, t, (B, S / SQ, SQ, SG, SN), {1: 1, 2: 3})
    return b.view(name, t, (B, S / SQ, SQ, SG, SH / SG, SP), {1: 1, 2: 3})  # heads = groups x heads per group


def _conv(b: GraphBuilder, t: Tensor, channels: tuple, name: str) -> Tensor:
    """Depthwise causal convolution of width SC over the sequence, then SiLU."""
    w = weight(f"{name}.w", (*channels, SC), Layout.of(tp=Split(0)))
    (y,) = b.vector(name, (t, w), flops_per_elem=2 * SC + 4, bwd_flops_per_elem=4 * SC + 4, needs=("in0",))
    return y


def _ssd(b: GraphBuilder, x: Tensor, bm: Tensor, cm: Tensor, dt: Tensor) -> Tensor:
    """State space duality over chunks: intra-chunk C B^T and its product with x, chunk states, their outputs."""
    xc, bc, cc = _chunked(b, "x_chunks", x, False), _chunked(b, "b_chunks", bm, True), _chunked(b, "c_chunks", cm, True)
    scores = b.einsum("ssd_cb", "bcqgn,bckgn->bcgqk", (cc, bc))
    (scores,) = b.vector("ssd_decay", (scores, dt), flops_per_elem=4, bwd_flops_per_elem=4, needs=("in0", "in1"))
    y_diag = b.einsum("ssd_diag", "bcgqk,bckgrp->bcqgrp", (scores, xc))
    states = b.einsum("ssd_states", "bckgn,bckgrp->bcgrpn", (bc, xc))
    (states,) = b.vector("ssd_state_pass", (states, dt), flops_per_elem=3, bwd_flops_per_elem=3, needs=("in1",))
    y_off = b.einsum("ssd_off", "bcqgn,bcgrpn->bcqgrp", (cc, states))
    (y,) = b.vector("ssd_sum", (y_diag, y_off), bwd="identity", linear=True)
    return b.view("ssd_out", y, (B, S, SH, SP), {1: 1, 3: 2})


def mamba2(b: GraphBuilder, x: Tensor, arch: Arch) -> Tensor:
    """Pre-norm Mamba-2 mixer; returns x + mixer(x)."""
    h = _norm(b, x, arch, "ln_ssm")
    heads = Layout.of(tp=Split(1))
    z = b.einsum("in_z", "bsh,hnp->bsnp", (h, weight("w_in_z", (H, SH, SP), heads)))
    xs = b.einsum("in_x", "bsh,hnp->bsnp", (h, weight("w_in_x", (H, SH, SP), heads)))
    bm = b.einsum("in_b", "bsh,hgn->bsgn", (h, weight("w_in_b", (H, SG, SN), heads)))
    cm = b.einsum("in_c", "bsh,hgn->bsgn", (h, weight("w_in_c", (H, SG, SN), heads)))
    dt = b.einsum("in_dt", "bsh,hn->bsn", (h, weight("w_in_dt", (H, SH), heads)))
    (dt,) = b.vector("dt_softplus", (dt, weight("dt_bias", (SH,), Layout.of(tp=Split(0)))), flops_per_elem=4,
                     needs=("in0",))
    xs = _conv(b, xs, (SH, SP), "conv_x")
    bm = _conv(b, bm, (SG, SN), "conv_b")
    cm = _conv(b, cm, (SG, SN), "conv_c")
    y = _ssd(b, xs, bm, cm, dt)
    (y,) = b.vector("ssm_gate", (y, z), flops_per_elem=5, bwd_flops_per_elem=8, needs=("in0", "in1"))
    (y,) = b.vector("ssm_norm", (y, weight("ssm_norm.g", (SH, SP), heads)), flops_per_elem=5, bwd_flops_per_elem=8,
                    needs=("in0",))
    y = b.einsum("out_proj", "bsnp,nph->bsh", (y, weight("w_out", (SH, SP, H), Layout.of(tp=Split(0)))))
    return _residual_add(b, x, y, arch, "ssm_residual")
