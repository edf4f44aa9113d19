"""Build one block (embedding, a decoder layer of any kind, head): forward, derived
backward, and the recompute policy that decides what is saved."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from stageopt.frameworks.profile import LOW_PRECISION_RECIPES
from stageopt.graph import templates
from stageopt.graph.autodiff import differentiate
from stageopt.graph.builder import GraphBuilder
from stageopt.graph.fusion import fuse_ops
from stageopt.graph.latent_attention import mla_attention
from stageopt.graph.moe_template import moe
from stageopt.graph.ssm import mamba2
from stageopt.graph.symbols import SW
from stageopt.graph.templates import Arch
from stageopt.graph.tensor import Op, Tensor
from stageopt.model.layer_types import HEAD_KINDS, LAYER_KINDS, MTP_KINDS, base_kind, is_layer, is_stored, kind_parts

BLOCK_KINDS = ("embedding", *LAYER_KINDS, *MTP_KINDS, "head")


@dataclass(frozen=True)
class BlockGraph:
    """Ops of one block for one micro-batch, and the tensors it keeps for backward."""

    kind: str
    fwd: tuple[Op, ...]
    bwd: tuple[Op, ...]
    recompute: tuple[Op, ...]
    weights: tuple[Tensor, ...]
    weight_grads: tuple[Tensor, ...]  # aligned with weights
    saved: tuple[Tensor, ...]  # held from forward to backward (per micro-batch)
    working_set: tuple[Tensor, ...]  # what a fully recomputed block materializes during its backward
    input: Tensor | None
    output: Tensor
    wgrad: tuple[bool, ...] = ()  # aligned with bwd: the op computes weight gradients only (a W pass)
    # FP8 training (Transformer Engine): an FP8 GEMM's weight gradient keeps only the FP8 (1-byte) copy of
    # its input; ``fp8_saved`` are the saved uids with such a copy, ``fp8_only`` those kept in no other form
    fp8_saved: frozenset[int] = frozenset()
    fp8_only: frozenset[int] = frozenset()

    def w_ops(self) -> tuple[Op, ...]:
        return tuple(op for op, w in zip(self.bwd, self.wgrad) if w)


def _forward(kind: str, arch: Arch) -> tuple[GraphBuilder, Tensor | None, Tensor]:
    b = GraphBuilder("fwd", arch.lowp_gather)
    if kind == "embedding":
        _tokens, out = templates.embedding(b, arch)
        return b, None, out
    x = templates.layer_input(arch)
    if kind in HEAD_KINDS:
        return b, x, templates.head(b, x, arch, shared=(kind == "mtp_head"))
    if kind == "mtp":
        return b, x, templates.mtp_input(b, x, arch)
    mixer, ffn = kind_parts(kind)
    if arch.parallel_block != "off" and mixer in ("attn", "swa") and ffn == "mlp":
        return b, x, templates.parallel_layer(b, x, arch, window=SW if mixer == "swa" else None)
    y = x
    if mixer == "attn":
        y = mla_attention(b, x, arch) if arch.attention_type == "mla" else templates.attention(b, x, arch)
    elif mixer == "swa":
        y = templates.attention(b, x, arch, window=SW)
    elif mixer == "mamba":
        y = mamba2(b, x, arch)
    if ffn == "moe":
        y = moe(b, y, arch)
    elif ffn == "mlp":
        y = templates.mlp(b, y, arch)
    return b, x, y


@lru_cache(maxsize=64)
def build_block(kind: str, arch: Arch, recompute: str) -> BlockGraph:
    """Forward ops, backward from per-op rules, and recompute applied (layers only)."""
    if is_stored(kind):  # a layer partial recompute keeps whole
        kind, recompute = base_kind(kind), "none"
    fwd, x, y = _forward(kind, arch)
    seed = None if kind in HEAD_KINDS else fwd.derive(y, f"d{y.name}", role="grad")
    back = differentiate(fwd, y, seed, x, arch.tp_regather)
    weights: dict[int, Tensor] = {}
    for op in fwd.ops:
        for t in op.inputs:
            if t.role == "weight":
                weights.setdefault(t.uid, t)
    saved = dict(back.saved)
    high_reads = set(back.high_reads)  # saved uids some op needs in high precision
    bwd_ops = list(back.bwd_ops if hasattr(back, "bwd_ops") else back.ops)
    recompute_ops: list[Op] = []
    layer = is_layer(kind)
    if layer and recompute == "full":
        recompute_ops = [dataclasses.replace(op, phase="recompute") for op in fwd.ops]
        bwd_ops = [op for op in bwd_ops if "regather_of" not in op.attrs]
        saved = {x.uid: x}
        high_reads.add(x.uid)
    elif layer and recompute == "selective":
        region = selective_region(fwd.ops, arch.selective)
        produced = {t.uid for op in region for t in op.outputs}
        if arch.selective != "op":
            # what the attention core hands to the rest of the layer stays saved (a plain checkpoint); the
            # other modules drop their outputs too and re-form them for backward (Megatron-Core's
            # CheckpointWithoutOutput for layernorm, mla_up_proj and moe_act)
            inside = {id(op) for op in region}
            core = {t.uid for op in region if op.region == "attn_core" for t in op.outputs}
            produced -= core & {t.uid for op in fwd.ops if id(op) not in inside for t in op.inputs}
        recompute_ops = [dataclasses.replace(op, phase="recompute") for op in region]
        bwd_ops = [op for op in bwd_ops if op.attrs.get("regather_of") not in produced]
        saved = {uid: t for uid, t in saved.items() if uid not in produced}
        for op in region:
            for t in op.inputs:
                if t.uid not in produced and t.role != "weight":
                    saved[t.uid] = _unconverted(fwd, t)
                    high_reads.add(saved[t.uid].uid)  # the recomputed forward reads it
    phases = _fused((tuple(fwd.ops), tuple(bwd_ops), tuple(recompute_ops)), arch, keep={
        y.uid, *(t.uid for t in saved.values()), *(g.uid for g in back.weight_grads.values()),
        *((back.input_grad.uid,) if back.input_grad is not None else ())})
    weight_grads = tuple(back.weight_grads[uid] for uid in weights)
    saved = {t.uid: t for t in saved.values()}
    fp8_saved = frozenset(uid for uid in saved if uid in back.fp8_reads)
    return BlockGraph(
        kind=kind, fwd=phases[0], bwd=phases[1], recompute=phases[2],
        weights=tuple(weights.values()), weight_grads=weight_grads,
        saved=tuple(saved.values()),
        working_set=tuple(back.saved.values()), input=x, output=y,
        wgrad=weight_gradient_ops(list(phases[1]), {t.uid for t in weight_grads}),
        fp8_saved=fp8_saved, fp8_only=frozenset(fp8_saved - high_reads))


def selective_region(ops, policy: str) -> list:
    """The forward ops selective recompute re-runs under the stack's policy.

    ``attention``: the attention core (Megatron-LM's selective recomputation;
    Megatron-Core checkpoints it whatever its kernel, a fused flash kernel
    included: ``Attention._checkpointed_attention_forward``).
    ``modules:a+b``: Megatron-Core's named modules (:data:`RECOMPUTE_MODULE_OPS`).
    ``op``: torchtitan's op-level policy: matmul outputs are kept except every
    second matmul's, attention outputs and reduce-scatters are kept, every
    other op (norms, activations, residual adds, rotary, all-gathers) re-runs.
    """
    if policy == "attention":
        return [op for op in ops if op.region == "attn_core"]
    if policy.startswith("modules:"):
        names = policy.removeprefix("modules:").split("+")
        return [op for op in ops if any(RECOMPUTE_MODULE_OPS[n](op) for n in names)]
    region, matmuls = [], 0
    for op in ops:
        if op.kind == "matmul":
            matmuls += 1
            if matmuls % 2 == 0:
                region.append(op)
        elif op.kind in ("attention", "view") or (op.collective is not None and op.collective.kind == "reduce_scatter"):
            continue
        else:
            region.append(op)
    return region


_MLA_UP = ("q_norm", "q_up", "rope_q", "kv_norm", "k_up", "v_up", "rope_k", "k_concat")
# Which forward ops each of Megatron-Core's --recompute-modules covers (by the templates' op names).
RECOMPUTE_MODULE_OPS = {
    "core_attn": lambda op: op.region == "attn_core",
    "mla_up_proj": lambda op: op.name in _MLA_UP,  # MLA's up projections with their norms and RoPE
    "layernorm": lambda op: op.name in ("ln1", "ln2"),  # input and pre-MLP norms
    "mlp": lambda op: op.name.startswith("mlp.") and op.kind != "comm",  # dense MLP layers
    "moe": lambda op: (op.name.startswith(("expert.", "router")) or op.name in ("permute", "unpermute")
                       or (op.kind == "comm" and op.collective is not None and op.collective.axis == "ep")),
    # the experts' activation (with its fused first bias and the clamp before it)
    "moe_act": lambda op: op.name == "expert.swiglu" or op.name.startswith("expert.clamp_"),
    "shared_experts": lambda op: op.name.startswith("shared.") and op.kind != "comm",
}


def weight_gradient_ops(bwd: list[Op], wgrad_uids: set[int]) -> tuple[bool, ...]:
    """Which backward ops only serve weight gradients: the zero-bubble W pass (Qi et al. 2023).

    An op belongs to W if all it produces are weight gradients, or if everything
    it produces is read only by W ops (e.g. the all-gather that re-forms a
    sequence-parallel input for dW). The rest is the input-gradient pass the
    previous pipeline stage waits for.
    """
    readers: dict[int, list[int]] = {}
    for i, op in enumerate(bwd):
        for t in op.inputs:
            readers.setdefault(t.uid, []).append(i)
    in_w = [bool(op.outputs) and all(t.uid in wgrad_uids or t.role == "wgrad" for t in op.outputs) for op in bwd]
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(bwd))):
            outs = [t.uid for t in bwd[i].outputs]
            if not in_w[i] and outs and all(readers.get(u) and all(in_w[j] for j in readers[u]) for u in outs):
                in_w[i] = changed = True
    return tuple(in_w)


def _fused(phases: tuple[tuple[Op, ...], ...], arch: Arch, keep: set[int]) -> tuple[tuple[Op, ...], ...]:
    """Each phase's ops with the stack's fusions applied; a tensor another phase reads is kept."""
    out = []
    for i, ops in enumerate(phases):
        others = {t.uid for j, other in enumerate(phases) if j != i for op in other for t in op.inputs}
        out.append(fuse_ops(ops, arch.fusions, keep | others))
    return tuple(out)


def _unconverted(fwd: GraphBuilder, t: Tensor) -> Tensor:
    """Follow conversions back to the tensor as its producer wrote it (what is stored)."""
    op = fwd.producer.get(t.uid)
    while op is not None and op.kind in ("comm", "view") and "axis" in op.attrs:
        t = op.inputs[0]
        op = fwd.producer.get(t.uid)
    return t


def arch_of(model, plan) -> Arch:
    """The structural choices of a block: the model's, with the stack's attention kernel and dropout (and the
    experts' biases and their activation's clamp as the stack runs them)."""
    stack = plan.framework
    attention = stack.attention if stack.attention is not None else model.attention
    dropout = stack.dropout if stack.dropout is not None else model.dropout
    return Arch(norm=model.norm, activation=model.activation, attention=attention,
                position=model.position, bias=model.bias, dropout=dropout,
                tied=model.tied_embeddings, shared_experts=model.shared_experts > 0, sp=plan.sp,
                fusions=frozenset(stack.fusions), expert_capacity=model.expert_capacity,
                attention_type=model.attention_type, q_lora=model.q_lora_rank > 0,
                cp_comm=plan.cp_comm, moe_overlap=bool(plan.moe_overlap) and model.shared_experts > 0,
                selective=f"modules:{plan.recompute_modules}" if plan.recompute_modules else stack.selective_recompute,
                expert_tp=plan.etp == 0, tp_regather=stack.sp_saves_shard,
                lowp_gather=float(plan.dtype_bytes) if plan.dtype in LOW_PRECISION_RECIPES else 0.0,
                parallel_block=model.parallel_block, rope_fusable=model.rope_mscale == 1,
                expert_bias=stack.expert_bias, qk_norm=model.qk_norm,
                expert_clamp=model.activation_clamp > 0 and "activation_clamp" not in stack.fusions,
                loss=stack.cross_entropy, attention_unpad=stack.attention_unpad,
                expert_gemm_each=stack.expert_gemms == "per_expert")
