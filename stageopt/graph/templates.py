"""Module templates: the forward ops of each block type, with their layouts.

Sharding is declared here, independent of the degrees: weights say which
dimension each axis splits (Megatron's column/row parallel linears, vocab-
parallel embedding and output layer, expert-parallel expert weights), the
residual stream says how activations between blocks are placed (split along
the sequence over CP, and over TP too with sequence parallelism). The builder
inserts every collective that follows from these choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from stageopt.graph.builder import GraphBuilder
from stageopt.graph.layout import PARTIAL, Layout, Split
from stageopt.graph.symbols import B, CP, D, F, G, H, R, S, V
from stageopt.graph.tensor import Op, Tensor, score_shape

ACT = 2  # bytes of a bf16 activation
MASK = 1  # bytes of a dropout mask element
FP32 = 4


@dataclass(frozen=True)
class Arch:
    """The structural choices a block template depends on (hashable cache key)."""

    norm: str
    activation: str
    attention: str
    position: str
    bias: bool
    dropout: bool
    tied: bool
    shared_experts: bool
    sp: bool
    fusions: frozenset[str] = frozenset()  # enabled fusion groups (stageopt.graph.fusion), from the stack
    expert_capacity: float = 1.0  # busiest rank's routed tokens over a balanced share (ModelSpec)
    attention_type: str = "mha"  # mha | mla (graph.latent_attention)
    q_lora: bool = False  # MLA queries through a low-rank bottleneck
    cp_comm: str = "all_gather"  # context parallelism: all_gather | p2p (ring; same graph) | a2a (Ulysses) | a2a+p2p
    moe_overlap: bool = False  # shared experts computed while the dispatch all-to-all is in flight
    selective: str = "attention"  # selective recompute: attention (core) | op (torchtitan) | modules:a+b (Megatron-Core)
    expert_tp: bool = True  # routed experts split over TP (Megatron's expert TP = tp) or whole on every TP rank
    tp_regather: bool = True  # SP: save a TP all-gather's shard and re-gather in backward (Megatron), else keep it whole
    lowp_gather: float = 0.0  # bytes an element of a low-precision GEMM's TP-gathered input moves (0: high precision)
    parallel_block: str = "off"  # off | shared_norm | two_norms (ModelSpec.parallel_block)
    rope_fusable: bool = True  # no YaRN scaling (ModelSpec.rope_mscale 1): a stack's fused RoPE kernel applies
    expert_bias: str = "fused"  # experts' biases: fused (serving) | megatron (2nd in fp32, eager) | eager (both, bf16)
    expert_clamp: bool = False  # experts' gated-activation inputs clamped eagerly first (Megatron-Core training)
    expert_gemm_each: bool = False  # one GEMM kernel per local expert (FrameworkProfile.expert_gemms per_expert)
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (ModelSpec.qk_norm)
    loss: str = "in_place"  # the stack's unfused cross-entropy (FrameworkProfile.cross_entropy; LOSS_PASSES)
    attention_unpad: bool = False  # flash attention through unpad/pad copies (FrameworkProfile.attention_unpad)


# Eager RoPE where a stack leaves it unfused: torchtitan's cast to fp32 complex, multiply, cast back is about
# three passes over the tensor each way. Megatron-Core's unfused path (rope_utils._apply_rotary_pos_emb_bshd,
# taken when YaRN's scaling is not 1) is six kernels forward: t*cos, -x2, cat (rotate half), *sin, add, cat
# with the empty pass-through part, 12 tensor-sized reads and writes (6 passes); backward, autograd's two
# products, the negation, the chunk's concatenation, the sum of the two gradients and the slice's zero-filled
# copy, 13 (6.5 passes). The cos/sin tables it builds each call are [seq, head dim]: negligible bytes.
MCORE_UNFUSED_ROPE_PASSES = (6.0, 6.5)

# Squared ReLU, torch.pow(F.relu(x), 2), where the stack leaves it to eager PyTorch (NeMo 2's
# llm/fn/activation.py: "remove until we have serialization"): relu, then pow, each reading and writing the
# tensor (2 passes); backward, autograd's pow gradient grad * (2 * x.pow(1)): the pow(1) copy (2 bytes read, 2
# written), the product with 2 (4), the product with the gradient (6), then relu's threshold_backward (6), 20
# bytes against the compiled kernel's 6 (read the gradient and the input, write the input's gradient).
# Compiled (NeMo 1's and Megatron-Core's jit_fuser, torch.compile): one kernel each way.
SQUARED_RELU_PASSES = (2.0, 20 / 6)

# FlashAttention's variable-length path through flash_attn.bert_padding (llm-foundry's attn_impl flash), per
# element of each tensor: unpadding gathers the rows (read, write: one pass) and its gradient zero-fills a
# buffer and scatters into it (a write, then a read and a write: 1.5 passes, two kernels); padding the output
# is the transpose, 1.5 passes forward and one backward.
UNPAD_PASSES, PAD_PASSES = (1.0, 1.5), (1.5, 1.0)

# Unfused cross-entropy, per logit: the op streams its bf16 input and fp32 softmax (6 bytes a pass) forward and
# the fp32 softmax, its gradient and the bf16 input gradient (10 bytes) backward; the loss's local sum adds 4
# bytes each way. Megatron's vocab-parallel loss (core/tensor_parallel/cross_entropy.py) on ``logits.float()``:
# the cast (6 bytes), max (4), subtract (8), exp (8), sum (4) and in-place normalise (8) forward, 38 bytes
# in six kernels; backward the in-place product with the loss gradient (8) and the cast back (6), 14.
# PyTorch's F.cross_entropy on an fp32 copy (torchtitan): the cast (6), log-softmax over a row too long for
# shared memory (max, sum-exp, then write: three reads and a write, 16), forward 22 bytes; backward the NLL
# gradient's zero fill (4), log-softmax's gradient (a sum pass, then read two and write one: 16) and the cast
# back (6), 26. Megatron-Core's native fused loss (core/fusions/fused_cross_entropy.py, cross_entropy_loss_fusion
# with the "native" implementation, the only one before Transformer Engine's) runs the same steps on the bf16
# logits as three compiled functions (jit_fuser: torch.compile from PyTorch 2.2): cast and max (6), subtract, exp
# and sum in place (8), normalise in place (8), 22 bytes in three kernels; backward one, the product with the loss
# gradient written back in place and the bf16 cast (10). Each is (bytes - 4 for the local sum) / (6 forward,
# 10 backward) passes.
LOSS_PASSES = {"in_place": ((38 - 4) / 6, (14 - 4) / 10), "pytorch": ((22 - 4) / 6, (26 - 4) / 10),
               "native_fused": ((22 - 4) / 6, (10 - 4) / 10),
               "te_fused": (2.0, 2.0), "flash_attn": (2.0, 2.0)}  # fused stacks merge the op (fusion cross_entropy)

ULYSSES_AXIS = {"a2a": "cp", "a2a+p2p": "cpa"}  # the axis whose sequence split Ulysses trades for heads


def ulysses_scatter(b: GraphBuilder, arch: Arch, tensors: tuple[Tensor, ...], heads_dim: int) -> tuple[Tensor, ...]:
    """Ulysses context parallelism: trade the sequence split for a split of the heads (all-to-alls).

    In the hierarchical mix only the all-to-all part (``cpa``) trades; the ring part (``cp``) keeps
    splitting the sequence, and attention then gathers K/V over it as a ring.
    """
    axis = ULYSSES_AXIS.get(arch.cp_comm)
    if axis is None:
        return tensors
    return tuple(b.convert(t, t.layout.with_(axis, Split(heads_dim))) for t in tensors)


def ulysses_gather(b: GraphBuilder, arch: Arch, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Back from the head split to the sequence split after attention."""
    axis = ULYSSES_AXIS.get(arch.cp_comm)
    if axis is None:
        return tensors
    return tuple(b.convert(t, t.layout.with_(axis, Split(1))) for t in tensors)


def ring_calls(arch: Arch) -> sp.Expr:
    """Attention kernel calls a query row's keys take: ring context parallelism (p2p, and the ring part of
    a2a+p2p) calls the kernel once per K/V chunk as the chunks go round (Transformer Engine's
    ``AttnFuncWithCPAndKVP2P``); all-gather and Ulysses call it once over all keys."""
    return CP if arch.cp_comm in ("p2p", "a2a+p2p") else sp.Integer(1)


def sequence_split(arch: Arch) -> dict[str, Split]:
    """The context-parallel axes that split the sequence: cp, and its all-to-all part in the hierarchical mix."""
    return {"cp": Split(1), "cpa": Split(1)} if arch.cp_comm == "a2a+p2p" else {"cp": Split(1)}


def residual_layout(arch: Arch) -> Layout:
    return Layout.of(**sequence_split(arch), tp=Split(1)) if arch.sp else Layout.of(**sequence_split(arch))


def weight(name: str, shape: tuple, layout: Layout = Layout(), group: str = "dense",
           counted: bool = True) -> Tensor:
    return Tensor(name=name, shape=tuple(shape), layout=layout, dtype_bytes=ACT, role="weight",
                  param_group=group, counted=counted)


def _norm(b: GraphBuilder, x: Tensor, arch: Arch, name: str) -> Tensor:
    params = [weight(f"{name}.g", (H,))]
    if arch.norm == "layernorm":
        params.append(weight(f"{name}.b", (H,)))
    # Eager RMSNorm is a chain of kernels (square-mean, rsqrt-scale, weight): about three passes over x;
    # PyTorch's LayerNorm is one native kernel.
    passes = 3.0 if arch.norm == "rmsnorm" else 1.0
    (y,) = b.vector(name, (x, *params), flops_per_elem=5, bwd_flops_per_elem=8, needs=("in0",), fuse="norm",
                    eager_passes=passes)
    return y


def _head_norm(b: GraphBuilder, x: Tensor, arch: Arch, name: str) -> Tensor:
    """RMSNorm of each head's query or key over the head dimension (QK-norm): a norm kernel of its own (Transformer
    Engine's RMSNorm in Megatron-Core), about three passes in eager PyTorch, like the layer norms."""
    (y,) = b.vector(name, (x, weight(f"{name}.g", (D,))), flops_per_elem=5, bwd_flops_per_elem=8, needs=("in0",),
                    fuse="norm", eager_passes=3.0)
    return y


def _bias(b: GraphBuilder, y: Tensor, arch: Arch, name: str, size: sp.Expr, layout: Layout,
          target: Layout | None = None, fuse: str = "") -> Tensor:
    if not arch.bias:
        return y
    (out,) = b.vector(f"{name}.bias_add", (y, weight(f"{name}.bias", (size,), layout)),
                      bwd="generic", bwd_flops_per_elem=1, layout=target, fuse=fuse)
    return out


def _dropout(b: GraphBuilder, x: Tensor, arch: Arch, name: str, fuse: str = "") -> Tensor:
    if not arch.dropout:
        return x
    y, _mask = b.vector(name, (x,), flops_per_elem=2, bwd_flops_per_elem=1, needs=("out1",), fuse=fuse, random=True,
                        outputs=((name, x.dtype_bytes, "activation"), (f"{name}.mask", MASK, "mask")))
    return y


def _residual_add(b: GraphBuilder, x: Tensor, y: Tensor, arch: Arch, name: str) -> Tensor:
    (out,) = b.vector(name, (x, y), bwd="identity", layout=residual_layout(arch), fuse="bias_dropout_add")
    return out


def attention(b: GraphBuilder, x: Tensor, arch: Arch, window: sp.Expr | None = None) -> Tensor:
    """Pre-norm self-attention with grouped-query heads; returns x + attn(x)."""
    y = _attention_mix(b, _norm(b, x, arch, "ln1"), arch, window)
    y = _bias(b, y, arch, "proj", H, Layout(), target=residual_layout(arch), fuse="bias_dropout_add")
    y = _dropout(b, y, arch, "proj_dropout", fuse="bias_dropout_add")
    return _residual_add(b, x, y, arch, "attn_residual")


def parallel_layer(b: GraphBuilder, x: Tensor, arch: Arch, window: sp.Expr | None = None) -> Tensor:
    """Attention and MLP side by side (``Arch.parallel_block``): ``x + attn(ln1(x)) + mlp(ln2(x))``, with
    ``ln2 = ln1`` under ``shared_norm``. The two row-parallel outputs are partial sums over TP that add up
    locally, so one reduction (all-reduce, or reduce-scatter with SP) serves both; under SP the shared norm's
    output is gathered once for the QKV and the MLP GEMMs. Biases and dropout act on the reduced sum."""
    h = _norm(b, x, arch, "ln1")
    h_mlp = _norm(b, x, arch, "ln2") if arch.parallel_block == "two_norms" else h
    attn = _attention_mix(b, h, arch, window)
    mlp_out = _mlp_core(b, h_mlp, arch, F, "mlp")
    (y,) = b.vector("branch_sum", (attn, mlp_out), bwd="identity", linear=True, fuse="bias_dropout_add")
    for name in ("proj", "mlp.fc2"):
        y = _bias(b, y, arch, name, H, Layout(), target=residual_layout(arch), fuse="bias_dropout_add")
    y = _dropout(b, y, arch, "hidden_dropout", fuse="bias_dropout_add")
    return _residual_add(b, x, y, arch, "residual")


def _padding_copy(b: GraphBuilder, t: Tensor, name: str, passes: float, bwd_passes: float) -> Tensor:
    """A gather or scatter of a tensor's token rows (:data:`UNPAD_PASSES`); its gradient needs nothing saved."""
    (out,) = b.vector(name, (t,), flops_per_elem=0, bwd_flops_per_elem=0, linear=True, eager_passes=passes,
                      bwd_eager_passes=bwd_passes)
    return out


def _attention_mix(b: GraphBuilder, h: Tensor, arch: Arch, window: sp.Expr | None) -> Tensor:
    """QKV projections, attention and the row-parallel output projection of the normed input ``h``; returns
    the projection's output (a partial sum over TP).

    ``window``: sliding-window attention over that many past tokens; a fused kernel then computes the
    causal band, ``(2 W S - W^2) / S^2`` of the full matrix (counted, like causal attention, as twice
    the positions a causal kernel visits).
    """
    qkv = {"gemm_group": "qkv"}  # one fused GEMM where the stack fuses the projections
    q = b.einsum("q", "bsh,hgrd->bsgrd", (h, weight("wq", (H, G, R, D), Layout.of(tp=Split(1)))), extra=qkv)
    k = b.einsum("k", "bsh,hgd->bsgd", (h, weight("wk", (H, G, D), Layout.of(tp=Split(1)))), extra=qkv)
    v = b.einsum("v", "bsh,hgd->bsgd", (h, weight("wv", (H, G, D), Layout.of(tp=Split(1)))), extra=qkv)
    if arch.bias:
        q = _bias(b, q, arch, "q", G * R * D, Layout.of(tp=Split(0)))
        k = _bias(b, k, arch, "k", G * D, Layout.of(tp=Split(0)))
        v = _bias(b, v, arch, "v", G * D, Layout.of(tp=Split(0)))
    if arch.qk_norm:
        q = _head_norm(b, q, arch, "q_head_norm")
        k = _head_norm(b, k, arch, "k_head_norm")
    if arch.position == "rope":
        fuse, passes, bwd_passes = ("rope", 3.0, 3.0) if arch.rope_fusable else ("", *MCORE_UNFUSED_ROPE_PASSES)
        (q,) = b.vector("rope_q", (q,), flops_per_elem=3, bwd_flops_per_elem=3, fuse=fuse, eager_passes=passes,
                        bwd_eager_passes=bwd_passes)
        (k,) = b.vector("rope_k", (k,), flops_per_elem=3, bwd_flops_per_elem=3, fuse=fuse, eager_passes=passes,
                        bwd_eager_passes=bwd_passes)
    q, k, v = ulysses_scatter(b, arch, (q, k, v), 2)
    unpad = arch.attention_unpad and arch.attention == "flash"
    if unpad:
        q, k, v = (_padding_copy(b, t, f"unpad_{n}", *UNPAD_PASSES) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    b.region = "attn_core"
    if arch.attention == "flash":
        band = 1 if window is None else (2 * sp.Min(window, S) * S - sp.Min(window, S) ** 2) / S**2
        ring = ring_calls(arch)  # keys a query row keeps (S band / 2 on average), over the ring's calls
        edges = 1 if window is None else 2  # a window below S has two mask edges
        shape = score_shape(4 * D, band * S / 2 / ring, sp.Integer(edges) / ring)
        o = b.einsum("attn", "bsgrd,btgd,btgd->bsgrd", (q, k, v), kind="attention",
                     flops_scale=2 * band, extra={"causal": True, "gemm": shape})
    else:
        scores = b.einsum("scores", "bsgrd,btgd->bsgrt", (q, k), extra={"causal": True})
        (probs,) = b.vector("softmax", (scores,), flops_per_elem=5, bwd_flops_per_elem=4, needs=("out0",))
        probs = _dropout(b, probs, arch, "attn_dropout")
        o = b.einsum("context", "bsgrt,btgd->bsgrd", (probs, v), extra={"causal": True})
    b.region = ""
    if unpad:
        o = _padding_copy(b, o, "pad_output", *PAD_PASSES)
    (o,) = ulysses_gather(b, arch, (o,))
    return b.einsum("proj", "bsgrd,grdh->bsh", (o, weight("wo", (G, R, D, H), Layout.of(tp=Split(0)))))


def _mlp_core(b: GraphBuilder, h: Tensor, arch: Arch, width: sp.Expr, name: str) -> Tensor:
    """Column-parallel up projection(s), activation, row-parallel down projection (partial sum)."""
    col = Layout.of(tp=Split(1))
    if arch.activation == "swiglu":
        fc1 = {"gemm_group": "fc1"}
        gate = b.einsum(f"{name}.gate", "bsh,hf->bsf", (h, weight(f"{name}.w_gate", (H, width), col)), extra=fc1)
        up = b.einsum(f"{name}.up", "bsh,hf->bsf", (h, weight(f"{name}.w_up", (H, width), col)), extra=fc1)
        (act,) = b.vector(f"{name}.swiglu", (gate, up), flops_per_elem=5, bwd_flops_per_elem=8,
                          needs=("in0", "in1"), fuse="bias_activation", eager_passes=5 / 3)  # silu, then mul
    else:
        up = b.einsum(f"{name}.fc1", "bsh,hf->bsf", (h, weight(f"{name}.w1", (H, width), col)))
        up = _bias(b, up, arch, f"{name}.fc1", width, Layout.of(tp=Split(0)), fuse="bias_activation")
        if arch.activation == "squared_relu":
            (act,) = b.vector(f"{name}.squared_relu", (up,), flops_per_elem=2, bwd_flops_per_elem=3, needs=("in0",),
                              fuse="squared_relu", eager_passes=SQUARED_RELU_PASSES[0],
                              bwd_eager_passes=SQUARED_RELU_PASSES[1])
        else:
            (act,) = b.vector(f"{name}.gelu", (up,), flops_per_elem=8, bwd_flops_per_elem=12, needs=("in0",),
                              fuse="bias_activation")
    return b.einsum(f"{name}.down", "bsf,fh->bsh", (act, weight(f"{name}.w2", (width, H), Layout.of(tp=Split(0)))))


def mlp(b: GraphBuilder, x: Tensor, arch: Arch, normed: bool = True) -> Tensor:
    """Pre-norm MLP; returns x + mlp(x). ``normed=False`` reads ``x`` as it comes: serving's MLP half of a
    parallel block under a shared norm, whose input the attention half normed already."""
    h = _norm(b, x, arch, "ln2") if normed else x
    y = _mlp_core(b, h, arch, F, "mlp")
    y = _bias(b, y, arch, "mlp.fc2", H, Layout(), target=residual_layout(arch), fuse="bias_dropout_add")
    y = _dropout(b, y, arch, "mlp_dropout", fuse="bias_dropout_add")
    return _residual_add(b, x, y, arch, "mlp_residual")


def embedding(b: GraphBuilder, arch: Arch) -> tuple[Tensor, Tensor]:
    """Vocab-parallel token embedding (+ learned positions); returns (token ids, residual stream)."""
    tokens = Tensor(name="tokens", shape=(B, S), layout=Layout.of(**sequence_split(arch)), dtype_bytes=4, role="input")
    table = weight("embedding", (V, H), Layout.of(tp=Split(0)))
    out = Tensor(name="embedded", shape=(B, S, H), layout=Layout.of(**sequence_split(arch), tp=PARTIAL),
                 dtype_bytes=ACT)
    b.emit(Op(name="embed", kind="vector", inputs=(tokens, table), outputs=(out,),
              vector_flops=sp.Integer(0), attrs={"needs": (), "bwd": "generic", "bwd_flops": 1}))
    x = out
    if arch.position == "learned":
        (x,) = b.vector("add_positions", (x, weight("positions", (S, H))), bwd_flops_per_elem=1,
                        layout=residual_layout(arch))
    else:
        x = b.convert(x, residual_layout(arch))
    x = _dropout(b, x, arch, "embedding_dropout")
    return tokens, x


def head(b: GraphBuilder, x: Tensor, arch: Arch, shared: bool = False) -> Tensor:
    """Final norm, vocab-parallel output layer and cross-entropy; returns the loss.

    ``shared``: the output layer is the main head's (a multi-token-prediction module's prediction),
    so it computes and takes gradients but holds no parameters of its own.
    """
    h = _norm(b, x, arch, "mtp_ln_f" if shared else "ln_f")
    logits = b.einsum("logits", "bsh,vh->bsv", (h, weight("output", (V, H), Layout.of(tp=Split(0)),
                                                           counted=not (arch.tied or shared))), precision=0)
    fwd_passes, bwd_passes = LOSS_PASSES[arch.loss]
    (probs,) = b.vector("cross_entropy", (logits,), flops_per_elem=6, bwd_flops_per_elem=2, needs=("out0",),
                        fuse="cross_entropy", eager_passes=fwd_passes, bwd_eager_passes=bwd_passes,
                        outputs=(("softmax_fp32", FP32, "logits"),))
    # Vocab-parallel cross-entropy leaves each token's loss as a partial sum over TP (max, sum-exp
    # and target logit are all-reduced; modelled as one all-reduce of B*S/cp fp32 values).
    token_loss = Tensor(name="token_loss", shape=(B, S), layout=Layout.of(**sequence_split(arch), tp=PARTIAL),
                        dtype_bytes=FP32)
    b.emit(Op(name="loss_reduce_local", kind="vector", inputs=(probs,), outputs=(token_loss,),
              vector_flops=probs.local_numel(),
              attrs={"needs": (), "bwd": "generic", "bwd_flops": 1, "fuse": "cross_entropy"}))
    return b.convert(token_loss, Layout.of(**sequence_split(arch)))


def mtp_input(b: GraphBuilder, x: Tensor, arch: Arch) -> Tensor:
    """A multi-token-prediction module's input (DeepSeek-V3 sec. 2.2): the next tokens through the shared
    embedding and the hidden state ``x``, each normed, concatenated and projected 2h -> h (Megatron's
    column-parallel ``eh_proj``, gathered back to the residual layout). The concatenation is written as
    the two halves of the projection summed: the same FLOPs and bytes."""
    tokens = Tensor(name="mtp_tokens", shape=(B, S), layout=Layout.of(**sequence_split(arch)), dtype_bytes=4,
                    role="input")
    table = weight("embedding", (V, H), Layout.of(tp=Split(0)), counted=False)
    embedded = Tensor(name="mtp_embedded", shape=(B, S, H), layout=Layout.of(**sequence_split(arch), tp=PARTIAL),
                      dtype_bytes=ACT)
    b.emit(Op(name="mtp_embed", kind="vector", inputs=(tokens, table), outputs=(embedded,),
              vector_flops=sp.Integer(0), attrs={"needs": (), "bwd": "generic", "bwd_flops": 1}))
    e = _norm(b, b.convert(embedded, residual_layout(arch)), arch, "mtp_enorm")
    h = _norm(b, x, arch, "mtp_hnorm")
    col = Layout.of(tp=Split(1))
    from_h = b.einsum("mtp_proj_h", "bsh,hk->bsk", (h, weight("mtp_eh_h", (H, H), col)))
    from_e = b.einsum("mtp_proj_e", "bsh,hk->bsk", (e, weight("mtp_eh_e", (H, H), col)))
    (y,) = b.vector("mtp_proj_sum", (from_h, from_e), bwd="identity")
    return b.convert(y, residual_layout(arch))


def layer_input(arch: Arch) -> Tensor:
    return Tensor(name="x", shape=(B, S, H), layout=residual_layout(arch), dtype_bytes=ACT)

