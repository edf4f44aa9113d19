"""The inference graph: the training templates' forward ops, with attention reading a KV cache.

Why a builder and not new templates: serving runs the same layers as training
(same weights, layouts and collectives), so every block is built by the shared
module templates (:mod:`stageopt.graph.templates`) through the shared layout
matcher. The one thing inference changes is where attention's keys and values
come from: in a serving step a sequence's new tokens (``S`` of them) attend to
``T`` keys held in the paged KV cache. :class:`CacheBuilder` makes that change
generically: in every attention einsum (``kind="attention"``, or an einsum
marked ``causal``: flash and eager attention alike), each operand after the
first that carries the token dimension ``S`` as its sequence axis is a
key/value operand; it is replaced by a cache tensor of the same layout with
``T`` in place of ``S``, and a ``kv_append`` kernel writes the new tokens'
copy into the cache. So the KV cache -- its bytes per token, its split over TP,
what decode reads -- is whatever the attention template feeds attention's key
side (grouped-query K and V today; an absorbed MLA latent or a windowed cache
the day the templates write attention that way), never a per-family formula.
An attention op's ``window`` attribute, when a template sets one, caps ``T``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy as sp

from stageopt.graph import templates
from stageopt.graph.builder import GraphBuilder
from stageopt.graph.fusion import fuse_ops
from stageopt.graph.moe_template import moe
from stageopt.graph.symbols import S
from stageopt.graph.templates import Arch
from stageopt.graph.tensor import Op, Tensor

T = sp.Symbol("T", positive=True, integer=True)  # keys each sequence attends to (cached context + new tokens)

SERVING_BLOCKS = ("embedding", "attention", "mlp", "moe", "head")


class CacheBuilder(GraphBuilder):
    """A forward :class:`GraphBuilder` whose attention reads keys and values from a KV cache."""

    def __init__(self) -> None:
        super().__init__("fwd")
        self.cache: dict[int, Tensor] = {}  # uid of a new key/value tensor -> its cache tensor

    def einsum(self, name: str, spec: str, operands: tuple[Tensor, ...], **kwargs) -> Tensor:  # type: ignore[override]
        extra = kwargs.get("extra") or {}
        if kwargs.get("kind") == "attention" or extra.get("causal"):
            self._append([t for t in operands[1:] if self._is_new_kv(t)])
            operands = (operands[0],) + tuple(self.cache.get(t.uid, t) for t in operands[1:])
        return super().einsum(name, spec, operands, **kwargs)

    def _is_new_kv(self, t: Tensor) -> bool:
        return (t.role != "kv_cache" and len(t.shape) >= 2 and t.shape[1] == S and t.uid not in self.cache
                and self.producer.get(t.uid) is not None)

    def _append(self, new: list[Tensor]) -> None:
        """One kernel writes every new key/value tensor into its cache pages (vLLM's reshape_and_cache)."""
        if not new:
            return
        slots = tuple(self.derive(t, f"{t.name}_slot", role="kv_cache") for t in new)
        append = self.emit(Op(name="kv_append:" + "+".join(t.name for t in new), kind="vector", inputs=tuple(new),
                              outputs=slots, vector_flops=sp.Integer(0), attrs={"kv_append": True}))
        for t in new:
            cache = self.derive(t, f"{t.name}_cache", shape=(t.shape[0], T, *t.shape[2:]), role="kv_cache")
            self.producer[cache.uid] = append  # attention reads the cache after the append
            self.cache[t.uid] = cache


@dataclass(frozen=True)
class ServingBlock:
    """Forward ops of one serving block, and the KV-cache tensors it keeps per sequence."""

    kind: str
    ops: tuple[Op, ...]
    cache: tuple[Tensor, ...]


@lru_cache(maxsize=32)
def serving_block(kind: str, arch: Arch) -> ServingBlock:
    """Build one block with the shared templates (see the module docstring).

    ``attention`` is a layer's attention half (norm, QKV, cached attention,
    output projection, residual); ``mlp`` and ``moe`` its other half; ``head``
    is the output layer and the softmax over the vocabulary, evaluated for one
    token per sampled sequence.
    """
    if kind not in SERVING_BLOCKS:
        raise ValueError(f"serving block {kind!r} unknown; one of {', '.join(SERVING_BLOCKS)}")
    b = CacheBuilder()
    if kind == "embedding":
        templates.embedding(b, arch)
    else:
        x = templates.layer_input(arch)
        if kind == "mlp" and arch.parallel_block == "shared_norm":
            templates.mlp(b, x, arch, normed=False)
        else:
            {"attention": templates.attention, "mlp": templates.mlp, "moe": moe,
             "head": templates.head}[kind](b, x, arch)
    outputs = {t.uid for op in b.ops for t in op.outputs if t.role == "kv_cache"}
    ops = fuse_ops(b.ops, arch.fusions, outputs)
    return ServingBlock(kind=kind, ops=ops, cache=tuple(b.cache.values()))


# Squared ReLU: vLLM's ReLUSquaredActivation runs inside the model it compiles (torch.compile, V1's default).
SERVING_FUSIONS = frozenset({"norm", "bias_dropout_add", "bias_activation", "rope", "cross_entropy", "qkv", "fc1",
                             "squared_relu"})


def inference_arch(model, tp: int) -> Arch:
    """The structural choices of an inference graph: flash attention, no dropout, no sequence parallelism.

    Serving engines (vLLM, SGLang, TensorRT-LLM) keep the residual stream
    replicated over TP and all-reduce after each row-parallel projection, and
    launch fused kernels for the norm with its residual add, the gated
    activation and RoPE (vLLM's fused_add_rms_norm, silu_and_mul,
    rotary_embedding): the fusion groups of :mod:`stageopt.graph.fusion`.

    A parallel block (``ModelSpec.parallel_block``) is priced as the engines run it: the attention half and
    the MLP half each all-reduce their row-parallel output (vLLM's GPT-NeoX and Cohere layers do; its Falcon
    layer sums the two before one all-reduce, which is not modelled), and under a shared norm the MLP half
    reads the attention half's norm (one norm fewer a layer).
    """
    return Arch(norm=model.norm, activation=model.activation, attention="flash", position=model.position,
                bias=model.bias, dropout=False, tied=model.tied_embeddings,
                shared_experts=model.shared_experts > 0, sp=False, fusions=SERVING_FUSIONS,
                expert_capacity=model.expert_capacity, parallel_block=model.parallel_block, qk_norm=model.qk_norm)
