"""What one token leaves in the KV cache of each decoder layer: the shapes serving needs.

Why in the model package: the cache is an architectural fact (grouped-query
heads, MLA's compressed latent, sliding windows) that inference and memory
models read; it does not depend on how training is sharded.
"""

from __future__ import annotations

from dataclasses import dataclass

from stageopt.model.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class LayerKV:
    """Cache of one layer: values stored per token, and the tokens kept (0: all of them)."""

    values_per_token: int
    window: int = 0

    def tokens_kept(self, context: int) -> int:
        return min(context, self.window) if self.window else context


def layer_kv(spec: ModelSpec) -> LayerKV:
    """The cache of one attention layer: K and V per KV head, or MLA's latent plus shared rotary key."""
    if spec.attention_type == "mla":
        return LayerKV(values_per_token=spec.kv_lora_rank + spec.qk_rope_dim)
    return LayerKV(values_per_token=2 * spec.kv_heads * spec.dim_per_head)


def kv_cache_layers(spec: ModelSpec) -> list[LayerKV]:
    """One entry per decoder layer."""
    return [layer_kv(spec) for _ in range(spec.layers)]


def kv_cache_bytes(spec: ModelSpec, context: int, dtype_bytes: int = 2) -> int:
    """Bytes one sequence of ``context`` tokens keeps in the cache, over all layers."""
    return sum(kv.values_per_token * kv.tokens_kept(context) for kv in kv_cache_layers(spec)) * dtype_bytes
