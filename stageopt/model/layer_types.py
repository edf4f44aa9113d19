"""What each decoder layer of a model is: its token mixer and its feed-forward part, as a block kind.

Why: modern stacks mix layer types. Gemma and GPT-OSS alternate sliding-window
and global attention; Nemotron-H interleaves Mamba-2, attention and MLP
layers; DeepSeek-V3 starts with dense layers before MoE. A model's
``layer_pattern`` (repeated to the model's depth) names each layer:

=====  =====================================  ==============================
char   layer                                   example
=====  =====================================  ==============================
``G``  global attention + feed-forward         Llama, GPT
``L``  sliding-window attention + feed-forward  Gemma 3 ``LLLLLG``, GPT-OSS ``LG``
``M``  Mamba-2 + feed-forward                   Jamba-style hybrids
``m``  Mamba-2 only                             Nemotron-H ``M``
``a``  attention only                           Nemotron-H ``*``
``f``  feed-forward only                        Nemotron-H ``-``
=====  =====================================  ==============================

The feed-forward part is a dense MLP, or MoE for layers past ``dense_layers``
of an MoE model. Each (mixer, feed-forward) pair is one block kind the graph
builds once; the historical names stay: global attention with an MLP is
``dense``, with MoE ``moe``.
"""

from __future__ import annotations

PATTERN_CHARS = "GLMmaf"
_MIXER = {"G": "attn", "L": "swa", "M": "mamba", "m": "mamba", "a": "attn", "f": "none"}
_HAS_FFN = set("GLMf")
_NAMES = {("attn", "mlp"): "dense", ("attn", "moe"): "moe", ("attn", "none"): "attn",
          ("swa", "mlp"): "swa", ("swa", "moe"): "swa_moe",
          ("mamba", "mlp"): "mamba_mlp", ("mamba", "moe"): "mamba_moe", ("mamba", "none"): "mamba",
          ("none", "mlp"): "mlp", ("none", "moe"): "moe_ffn"}
_PARTS = {name: parts for parts, name in _NAMES.items()}
LAYER_KINDS = tuple(_PARTS)


# Suffix of a decoder layer kept whole under partial full recompute (Megatron-Core's
# --recompute-method block --recompute-num-layers N recomputes only the first N layers of each chunk):
# the same block, compiled without recompute.
STORED = "+stored"


def stored(kind: str) -> str:
    """The kind of a layer of ``kind`` that partial recompute leaves stored."""
    return kind + STORED


def is_stored(kind: str) -> bool:
    return kind.endswith(STORED)


def base_kind(kind: str) -> str:
    """The block a kind builds (a stored layer is its layer kind without recompute)."""
    return kind.removesuffix(STORED)


def kind_parts(kind: str) -> tuple[str, str]:
    """(mixer, feed-forward) of a layer block kind: mixer attn|swa|mamba|none, ffn mlp|moe|none."""
    return _PARTS[base_kind(kind)]


def is_layer(kind: str) -> bool:
    return base_kind(kind) in _PARTS


def layer_char(spec, index: int) -> str:
    pattern = spec.layer_pattern or "G"
    return pattern[index % len(pattern)]


def layer_kind(spec, index: int) -> str:
    """Block kind of decoder layer ``index`` (0-based)."""
    char = layer_char(spec, index)
    ffn = "none"
    if char in _HAS_FFN:
        ffn = "moe" if spec.experts and index >= spec.dense_layers else "mlp"
    return _NAMES[(_MIXER[char], ffn)]


def layer_kinds(spec) -> tuple[str, ...]:
    """Block kind of every decoder layer, in model order."""
    return tuple(layer_kind(spec, i) for i in range(spec.layers))


MTP_KINDS = ("mtp", "mtp_head")  # a multi-token-prediction module's input projection and its prediction
HEAD_KINDS = ("head", "mtp_head")  # blocks that end in logits and a loss


def mtp_layer_kind(spec) -> str:
    """Block kind of the decoder layer inside each multi-token-prediction module (the model's last layer's)."""
    return layer_kind(spec, spec.layers - 1)


def block_kinds(spec, with_stored: bool = False) -> tuple[str, ...]:
    """Every block kind a model needs: embedding, its layer kinds (first-seen order), MTP parts, head;
    ``with_stored`` adds each layer kind's stored variant (partial full recompute)."""
    mtp = MTP_KINDS if getattr(spec, "mtp_layers", 0) else ()
    layers = tuple(dict.fromkeys(layer_kinds(spec)))
    extra = tuple(stored(k) for k in layers) if with_stored else ()
    return ("embedding", *layers, *extra, *mtp, "head")


def chunk_layer_kinds(spec, start: int, count: int, recomputed: int | None = None) -> tuple[str, ...]:
    """Kinds of the ``count`` decoder layers from layer ``start`` on, as one model chunk holds them: with
    ``recomputed`` set (partial full recompute), the layers after the chunk's first ``recomputed`` are stored."""
    kinds = layer_kinds(spec)[start:start + count]
    if recomputed is None:
        return kinds
    return tuple(k if i < recomputed else stored(k) for i, k in enumerate(kinds))


def model_block_counts(spec) -> dict[str, int]:
    """Blocks of one model copy by kind (decoder layers, MTP modules with their layers, embedding, head)."""
    counts = {"embedding": 1}
    for kind in layer_kinds(spec):
        counts[kind] = counts.get(kind, 0) + 1
    mtp = getattr(spec, "mtp_layers", 0)
    if mtp:
        counts[mtp_layer_kind(spec)] += mtp
        counts.update(mtp=mtp, mtp_head=mtp)
    counts["head"] = 1
    return counts
