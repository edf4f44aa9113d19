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


def kind_parts(kind: str) -> tuple[str, str]:
    """(mixer, feed-forward) of a layer block kind: mixer attn|swa|mamba|none, ffn mlp|moe|none."""
    return _PARTS[kind]


def is_layer(kind: str) -> bool:
    return kind in _PARTS


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


def block_kinds(spec) -> tuple[str, ...]:
    """Every block kind a model needs: embedding, its layer kinds (first-seen order), MTP parts, head."""
    mtp = MTP_KINDS if getattr(spec, "mtp_layers", 0) else ()
    return ("embedding", *dict.fromkeys(layer_kinds(spec)), *mtp, "head")


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
