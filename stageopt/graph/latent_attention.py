"""Multi-head latent attention (MLA, DeepSeek-V2/V3): the block template, with its real projections.

Why a template of its own: MLA compresses keys and values into a small latent
(``kv_lora_rank``, 512 for DeepSeek-V3) plus one rotary key shared by all heads
(``qk_rope_dim``, 64), and queries through a ``q_lora_rank`` bottleneck (1536);
per head, queries and keys have ``qk_nope_dim + qk_rope_dim`` (192) dimensions
and values ``v_head_dim`` (128). Treating it as standard multi-head attention
gets the parameters roughly right but the attention FLOPs, the activations and
the KV cache wrong.

Sharding follows Megatron-Core: the down projections are replicated over TP
(under sequence parallelism they run on the sequence shard, and the latents,
not the hidden states, are gathered), the up projections are column-parallel
over heads and the output projection is row-parallel. The shared rotary key is
gathered to every TP rank; its gradient is a partial sum over the heads.
"""

from __future__ import annotations

from stageopt.graph.builder import GraphBuilder
from stageopt.graph.layout import REPLICATE, Layout, Split
from stageopt.graph.symbols import DN, DR, DV, KL, QL, B, G, H, S
from stageopt.graph.tensor import Op, Tensor, score_shape
from stageopt.graph.templates import (
    ACT,
    Arch,
    _dropout,
    _norm,
    _residual_add,
    ring_calls,
    ulysses_gather,
    ulysses_scatter,
    weight,
)


def _latent_norm(b: GraphBuilder, t: Tensor, size, name: str) -> Tensor:
    (y,) = b.vector(name, (t, weight(f"{name}.g", (size,))), flops_per_elem=5, bwd_flops_per_elem=8,
                    needs=("in0",))
    return y


def _attention_core(b: GraphBuilder, arch: Arch, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal flash attention with query/key width DN + DR and value width DV; keys span the whole sequence.

    Context parallelism gathers K and V (all_gather, p2p) or scatters heads (a2a, Ulysses), or both
    (a2a+p2p: heads over the all-to-all part, K/V gathered over the ring part).
    """
    q, k, v = ulysses_scatter(b, arch, (q, k, v), 2)  # a2a, or its part of the hierarchical mix
    full = k.layout if arch.cp_comm == "a2a" else Layout.of(**{a: p for a, p in k.layout.items if a != "cp"})
    k, v = b.convert(k, full), b.convert(v, full)
    out = Tensor(name="attn", shape=(B, S, G, DV), layout=q.layout, dtype_bytes=ACT)
    rows = q.local_dim(0) * q.local_dim(1) * q.local_dim(2)  # query positions x heads on this rank
    flops = 2 * rows * S * (DN + DR + DV)  # Q K^T over DN + DR, then P V over DV, whole s x s (MFU convention)
    ring = ring_calls(arch)  # keys a query row keeps (S / 2 on average), over the ring's calls
    shape = score_shape(2 * (DN + DR + DV), S / 2 / ring, 1 / ring)
    b.emit(Op(name="attn", kind="attention", inputs=(q, k, v), outputs=(out,), flops=flops,
              attrs={"causal": True, "spec": "mla", "gemm": shape}))
    return out


def _keys(b: GraphBuilder, h: Tensor, arch: Arch) -> tuple[Tensor, Tensor]:
    heads = Layout.of(tp=Split(1))
    latent = b.einsum("kv_down", "bsh,hl->bsl", (h, weight("wkv_a", (H, KL))))
    k_rope = b.einsum("k_rope", "bsh,hr->bsr", (h, weight("wk_rope", (H, DR))))
    latent = _latent_norm(b, latent, KL, "kv_norm")
    k_nope = b.einsum("k_up", "bsl,lnd->bsnd", (latent, weight("wkv_b_k", (KL, G, DN), heads)))
    v = b.einsum("v_up", "bsl,lnv->bsnv", (latent, weight("wkv_b_v", (KL, G, DV), heads)))
    if arch.position == "rope":
        (k_rope,) = b.vector("rope_k", (k_rope,), flops_per_elem=3, bwd_flops_per_elem=3)
    k_rope = b.convert(k_rope, k_rope.layout.with_("tp", REPLICATE))  # every head reads the shared rotary key
    k = Tensor(name="k", shape=(B, S, G, DN + DR), layout=k_nope.layout, dtype_bytes=ACT)
    b.emit(Op(name="k_concat", kind="vector", inputs=(k_nope, k_rope), outputs=(k,), vector_flops=k.local_numel(),
              attrs={"needs": (), "bwd": "generic", "bwd_flops": 1, "broadcast_partial": True}))
    return k, v


def mla_attention(b: GraphBuilder, x: Tensor, arch: Arch) -> Tensor:
    """Pre-norm multi-head latent attention; returns x + attn(x)."""
    h = _norm(b, x, arch, "ln1")
    heads = Layout.of(tp=Split(1))
    if arch.q_lora:
        latent_q = b.einsum("q_down", "bsh,hl->bsl", (h, weight("wq_a", (H, QL))))
        latent_q = _latent_norm(b, latent_q, QL, "q_norm")
        q = b.einsum("q_up", "bsl,lne->bsne", (latent_q, weight("wq_b", (QL, G, DN + DR), heads)))
    else:
        q = b.einsum("q", "bsh,hne->bsne", (h, weight("wq", (H, G, DN + DR), heads)))
    if arch.position == "rope":
        (q,) = b.vector("rope_q", (q,), flops_per_elem=3, bwd_flops_per_elem=3)
    k, v = _keys(b, h, arch)
    b.region = "attn_core"
    o = _attention_core(b, arch, q, k, v)
    b.region = ""
    (o,) = ulysses_gather(b, arch, (o,))
    y = b.einsum("proj", "bsnv,nvh->bsh", (o, weight("wo", (G, DV, H), Layout.of(tp=Split(0)))))
    y = _dropout(b, y, arch, "proj_dropout")
    return _residual_add(b, x, y, arch, "attn_residual")
