"""What one sequence leaves in the inference cache of each decoder layer: the shapes serving needs.

Why in the model package: the cache is an architectural fact (grouped-query heads, MLA's compressed
latent, sliding windows, Mamba-2's fixed-size state) that inference and memory models read; it does
not depend on how training is sharded.
"""

from __future__ import annotations

from dataclasses import dataclass

from stageopt.model.layer_types import kind_parts, layer_kinds
from stageopt.model.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class LayerKV:
    """Cache of one layer: values per cached token, the tokens kept (0: all), and a per-sequence state."""

    values_per_token: int
    window: int = 0
    state_values: int = 0  # Mamba-2: SSM state plus convolution tail, independent of the context length

    def tokens_kept(self, context: int) -> int:
        return min(context, self.window) if self.window else context

    def values(self, context: int) -> int:
        return self.values_per_token * self.tokens_kept(context) + self.state_values


def attention_kv(spec: ModelSpec) -> int:
    """Values one token stores in an attention layer: K and V per KV head, or MLA's latent plus rotary key."""
    if spec.attention_type == "mla":
        return spec.kv_lora_rank + spec.qk_rope_dim
    return 2 * spec.kv_heads * spec.dim_per_head


def layer_kv(spec: ModelSpec, index: int = 0) -> LayerKV:
    """The cache of decoder layer ``index``."""
    mixer, _ffn = kind_parts(layer_kinds(spec)[index])
    if mixer == "attn":
        return LayerKV(values_per_token=attention_kv(spec))
    if mixer == "swa":
        return LayerKV(values_per_token=attention_kv(spec), window=spec.sliding_window)
    if mixer == "mamba":
        channels = spec.ssm_heads * spec.ssm_head_dim
        conv = (channels + 2 * spec.ssm_groups * spec.ssm_state) * (spec.ssm_conv - 1)
        return LayerKV(values_per_token=0, state_values=channels * spec.ssm_state + conv)
    return LayerKV(values_per_token=0)


def kv_cache_layers(spec: ModelSpec) -> list[LayerKV]:
    """One entry per decoder layer."""
    return [layer_kv(spec, i) for i in range(spec.layers)]


def kv_cache_bytes(spec: ModelSpec, context: int, dtype_bytes: int = 2) -> int:
    """Bytes one sequence of ``context`` tokens keeps in the cache, over all layers."""
    return sum(kv.values(context) for kv in kv_cache_layers(spec)) * dtype_bytes
