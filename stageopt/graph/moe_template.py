"""The routed-expert (MoE) block template: router, dispatch, grouped expert MLPs, combine, shared experts.

Apart from :mod:`stageopt.graph.templates` because the expert path carries its own stack-specific eager
kernels (Megatron-Core's clamp before the activation and its fp32 expert-bias path, NeMo AutoModel's eager
bf16 biases) on top of the
all-to-all dispatch that expert parallelism inserts.
"""

from __future__ import annotations

import sympy as sp

from stageopt.graph.builder import GraphBuilder
from stageopt.graph.layout import PARTIAL, REPLICATE, Layout, Split
from stageopt.graph.symbols import EP, FE, NS, B, E, H, K, S
from stageopt.graph.templates import ACT, FP32, Arch, _bias, _mlp_core, _norm, _residual_add, weight
from stageopt.graph.tensor import Op, Tensor


def moe(b: GraphBuilder, x: Tensor, arch: Arch) -> Tensor:
    """Routed experts (top-k of E, balanced) behind all-to-all dispatch/combine, plus shared experts."""
    h = _norm(b, x, arch, "ln2")
    logits = b.einsum("router", "bsh,he->bse", (h, weight("w_router", (H, E))), out_dtype=FP32, precision=0)
    logits = _bias(b, logits, arch, "router", E, Layout())
    (probs,) = b.vector("router_topk", (logits,), flops_per_elem=6, bwd_flops_per_elem=4, needs=("out0",))
    tokens = _permute(b, h, probs, arch.expert_capacity)
    shared = None
    if arch.moe_overlap and arch.shared_experts:  # dispatch first, shared experts compute while it flies
        tokens = b.convert(tokens, Layout.of(**{**dict(tokens.layout.items), "tp": REPLICATE, "ep": Split(0)}))
        b.region = "shared_expert"
        shared = _mlp_core(b, h, arch, NS * FE, "shared")
        b.region = ""
    # Expert TP = tp splits each expert's width over the TP group; expert TP = 1 keeps experts whole on
    # every TP rank, which then runs its own (sequence-parallel) tokens through them.
    expert = Layout.of(ep=Split(0), tp=Split(2)) if arch.expert_tp else Layout.of(ep=Split(0))
    expert_down = Layout.of(ep=Split(0), tp=Split(1)) if arch.expert_tp else Layout.of(ep=Split(0))
    each = {"kernels": (0, 1)} if arch.expert_gemm_each else {}  # one GEMM kernel per local expert
    fc1 = {"gemm_group": "expert_fc1", **each}
    gate = b.einsum("expert.gate", "ech,ehf->ecf", (tokens, weight("we_gate", (E, H, FE), expert, "expert")),
                    extra=fc1)
    up = b.einsum("expert.up", "ech,ehf->ecf", (tokens, weight("we_up", (E, H, FE), expert, "expert")), extra=fc1)
    # Expert biases (gpt-oss): the first layer's are added inside the fused bias-activation kernel, or eagerly.
    fc1_bias = tuple(weight(f"we_{n}_bias", (E, FE), expert.with_("tp", Split(1)) if arch.expert_tp else expert,
                            "expert") for n in ("gate", "up")) if arch.bias else ()
    if fc1_bias and arch.expert_bias == "eager":
        gate, up = (_expert_eager_bias(b, half, bias, f"expert.{n}_bias")
                    for half, bias, n in zip((gate, up), fc1_bias, ("gate", "up")))
        fc1_bias = ()
    if arch.expert_clamp:
        gate, up = _expert_clamp(b, gate, up)
    (act,) = b.vector("expert.swiglu", (gate, up, *fc1_bias), flops_per_elem=5, bwd_flops_per_elem=8,
                      needs=("in0", "in1"), fuse="bias_activation")
    down = b.einsum("expert.down", "ecf,efh->ech",
                    (act, weight("we_down", (E, FE, H), expert_down, "expert")), extra=each)
    down = _expert_output_bias(b, down, arch)
    back = b.convert(down, down.layout.with_("ep", Split(1)))
    y = _unpermute(b, back, probs, h)
    if arch.shared_experts:
        shared = shared if shared is not None else _mlp_core(b, h, arch, NS * FE, "shared")
        (y,) = b.vector("shared_add", (y, shared), bwd="identity", linear=True)
    return _residual_add(b, x, y, arch, "moe_residual")


def _expert_clamp(b: GraphBuilder, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """The clamp of the experts' fc1 output before their activation (gpt-oss's ``swiglu_limit``).

    Megatron-Core runs it in eager PyTorch ahead of the fused activation (``weighted_bias_quick_geglu_impl``):
    forward, one clamp per half and a concatenation (3 kernels, 16 bytes an element of one half: each clamp
    reads and writes its half, the concatenation reads and writes both); backward, autograd's masks (gate:
    ``x <= max`` then ``where``; linear half: ``>=``, ``<=``, ``logical_and``, ``where``: 8 and 14 bytes an
    element) and a concatenation of the two gradients (8): 30 bytes an element of one half, 7 kernels.
    Each half is one op here: forward 2 passes over its input and output (4 bytes a pass), backward 2.5
    passes over the gradient, the saved input and the input gradient (6 bytes a pass).
    """
    out = []
    for name, half in (("gate", gate), ("up", up)):
        (clamped,) = b.vector(f"expert.clamp_{name}", (half,), flops_per_elem=1, bwd_flops_per_elem=2,
                              needs=("in0",), eager_passes=2.0, bwd_eager_passes=2.5)
        out.append(clamped)
    return out[0], out[1]


def _expert_output_bias(b: GraphBuilder, down: Tensor, arch: Arch) -> Tensor:
    """The routed experts' second bias (gpt-oss), scaled by each token's router probability.

    Megatron-Core adds it outside the grouped GEMM (``TEGroupedMLP._apply_bias`` as gpt-oss support, a329dd6d,
    wrote it and the published runs of 2025-26 ran it; 883533e0, 2026-08, adds a packed path that keeps
    the fp32 rows instead): per local expert, the bias row times the tokens' fp32 probabilities (an fp32 product,
    4 bytes an element) added to the bf16 output (10), the fp32 pieces concatenated (8) and cast back (6):
    28 bytes an element forward. Backward, the cast (6), the per-expert casts of the output gradient
    (6), the probability and bias gradients (a product and a reduction each: 12 and 12) and the
    concatenation of the output gradient (4): 40. Nothing output-sized is saved (the product keeps the
    bias row and the probabilities). Modelled as one unfused op of 7 passes forward and 10 backward over
    its bf16 input and output (4 bytes an element a pass), launching what the loop launches: 2 kernels
    per local expert and the concatenation and cast forward, 5 per local expert (cast, two products, two
    reductions) and the cast and concatenation backward. Serving engines add it in their fused MoE
    kernels (one bf16 pass here).
    """
    if not arch.bias:
        return down
    bias = weight("we_down_bias", (E, H), Layout.of(ep=Split(0)), "expert")
    if arch.expert_bias == "eager":
        return _expert_eager_bias(b, down, bias, "expert.fc2_bias", scaled=True)
    if arch.expert_bias != "megatron":
        (y,) = b.vector("expert.fc2_bias", (down, bias), linear=True)
        return y
    (y,) = b.vector("expert.fc2_bias", (down, bias), flops_per_elem=3, bwd_flops_per_elem=3, linear=True,
                    eager_passes=7.0, bwd_eager_passes=10.0, kernels=(2, 2), bwd_kernels=(2, 5))
    return y


def _expert_eager_bias(b: GraphBuilder, x: Tensor, bias: Tensor, name: str, scaled: bool = False) -> Tensor:
    """An expert bias added in bf16 by an eager loop over the rank's experts (NeMo AutoModel's
    ``GroupedExpertsDeepEP._apply_bias``): the grouped GEMM's output split by expert, each piece plus its bias
    row, the pieces concatenated. Forward, the add and the concatenation read and write the output once each
    (8 bytes an element); backward, autograd's split gradient concatenates the pieces again (4) and each bias
    gradient reduces them (2). The fc2 bias is first scaled by the tokens' router probabilities (``b * p``
    writes a bias-sized product per token: 4 more forward), whose gradient adds a product and a reduction for
    the bias and for the probabilities (10 more). Passes count 4 bytes an element: launches are one per local
    expert a step (two for the scaled add; four in its backward) and the concatenation.
    """
    passes, bwd_passes, per_expert, bwd_per_expert = (3.0, 4.0, 2, 4) if scaled else (2.0, 1.5, 1, 1)
    (y,) = b.vector(name, (x, bias), flops_per_elem=2 if scaled else 1, bwd_flops_per_elem=3 if scaled else 1,
                    linear=True, eager_passes=passes, bwd_eager_passes=bwd_passes, kernels=(1, per_expert),
                    bwd_kernels=(1, bwd_per_expert))
    return y


def _permute(b: GraphBuilder, h: Tensor, probs: Tensor, load: float) -> Tensor:
    """Group each rank's tokens by expert: [E, C, H], C counting tokens of all EP ranks.

    ``load`` scales C from a balanced share to what the busiest rank processes.
    """
    capacity = EP * B * S * K / E * sp.nsimplify(load)
    placements = {a: Split(1) for a, p in h.layout.items if p == Split(1)}
    placements["ep"] = Split(1)
    out = Tensor(name="routed", shape=(E, capacity, H), layout=Layout.of(**placements), dtype_bytes=ACT)
    b.emit(Op(name="permute", kind="vector", inputs=(h, probs), outputs=(out,),
              vector_flops=out.local_numel(), attrs={"needs": (), "bwd": "generic", "bwd_flops": 1}))
    return out


def _unpermute(b: GraphBuilder, back: Tensor, probs: Tensor, h: Tensor) -> Tensor:
    """Weighted sum of each token's k expert outputs, back in the token layout."""
    placements = {a: p for a, p in h.layout.items}
    if back.layout.get("tp") == PARTIAL:
        placements["tp"] = PARTIAL
    out = Tensor(name="moe_out", shape=h.shape, layout=Layout.of(**placements), dtype_bytes=ACT)
    b.emit(Op(name="unpermute", kind="vector", inputs=(back, probs), outputs=(out,),
              vector_flops=2 * back.local_numel(), attrs={"needs": ("in0", "in1"), "bwd": "generic", "bwd_flops": 2}))
    return out
