"""Hugging Face configs of layer-mixing models as ModelSpec fields: GPT-OSS, Gemma 2/3, Nemotron-H, StarCoder2.

Why apart from :mod:`stageopt.model.load`: these families mix layer types (sliding-window and global
attention; Mamba-2, attention and MLP layers), which their configs state in family-specific keys
(``layer_types``, ``sliding_window_pattern``, ``hybrid_override_pattern``; StarCoder2 one ``sliding_window``
for every layer). Stated approximations: a gated GELU (Gemma) is modelled as SwiGLU (same GEMMs, different
elementwise op); GPT-OSS's attention sinks are priced as plain attention (its biases and its clamped
activation, ``swiglu_limit``, are modelled). Nemotron-H's MLP layers are squared ReLU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stageopt.errors import ConfigError

HYBRID_TYPES = ("gpt_oss", "gemma2", "gemma3", "gemma3_text", "nemotron_h", "starcoder2")
_NEMOTRON_CHARS = {"M": "m", "*": "a", "-": "f"}


def _common(cfg: dict[str, Any], num: Callable[..., int], flag: Callable[[str, bool], bool]) -> dict[str, Any]:
    heads = num("num_attention_heads")
    named = cfg.get("_name_or_path")
    fields = {"name": named if isinstance(named, str) and named else str(cfg["model_type"]), "family": "llama",
              "layers": num("num_hidden_layers"), "hidden": num("hidden_size"), "heads": heads,
              "kv_heads": num("num_key_value_heads", heads), "ffn": num("intermediate_size"),
              "vocab": num("vocab_size"), "tied_embeddings": flag("tie_word_embeddings", False)}
    head_dim = num("head_dim", 0) or num("attention_head_dim", 0)
    if head_dim:
        fields["head_dim"] = head_dim
    return fields


def _layer_types_pattern(types: Any, origin: str) -> str:
    chars = {"sliding_attention": "L", "full_attention": "G"}
    if not isinstance(types, list) or any(not isinstance(t, str) for t in types):
        raise ConfigError(f"{origin}: layer_types must be a list of names like sliding_attention")
    unknown = sorted({t for t in types if t not in chars})[:3]
    if unknown:
        raise ConfigError(f"{origin}: layer_types {unknown} are not modelled; known: {', '.join(chars)}")
    return "".join(chars[t] for t in types)


def _swiglu_limit(cfg: dict[str, Any], origin: str) -> float:
    """GPT-OSS's clamp of its experts' gated activation (``swiglu_limit``; 0 where the config sets none)."""
    limit = cfg.get("swiglu_limit")
    if limit is None:
        return 0.0
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
        raise ConfigError(f"{origin}: swiglu_limit must be a number >= 0, got {limit!r}")
    return float(limit)


def hybrid_fields(cfg: dict[str, Any], origin: str, num: Callable[..., int],
                  flag: Callable[[str, bool], bool]) -> dict[str, Any]:
    """ModelSpec fields of a GPT-OSS, Gemma 2/3 or Nemotron-H config (the training ``seq`` comes from load.py).

    ``num`` and ``flag`` are load.py's type-checked readers of the config (a Gemma 3 multimodal config
    arrives as its ``text_config``).
    """
    kind = str(cfg["model_type"])
    fields = _common(cfg, num, flag)
    if kind == "gpt_oss":
        fields.update(family="moe", experts=num("num_local_experts"), top_k=num("num_experts_per_tok"),
                      expert_ffn=num("intermediate_size"), bias=flag("attention_bias", True),
                      sliding_window=num("sliding_window"), activation_clamp=_swiglu_limit(cfg, origin),
                      layer_pattern=_layer_types_pattern(cfg.get("layer_types") or ["sliding_attention",
                                                                                    "full_attention"], origin))
    elif kind == "starcoder2":  # LayerNorm, plain GELU MLP with biases, every layer windowed (when a window is set)
        window = cfg.get("sliding_window") is not None and num("sliding_window")
        fields.update(family="gpt", norm="layernorm", activation="gelu", bias=flag("use_bias", True),
                      tied_embeddings=flag("tie_word_embeddings", True),
                      **({"sliding_window": window, "layer_pattern": "L"} if window else {}))
    elif kind.startswith("gemma"):
        fields.update(sliding_window=num("sliding_window"), tied_embeddings=flag("tie_word_embeddings", True),
                      qk_norm=kind != "gemma2")  # Gemma 3 normalizes queries and keys; Gemma 2 soft-caps instead
        if cfg.get("layer_types"):
            fields["layer_pattern"] = _layer_types_pattern(cfg["layer_types"], origin)
        else:
            every = num("sliding_window_pattern", 2)  # gemma2: local and global alternate
            if not 1 <= every <= 10**4:
                raise ConfigError(f"{origin}: sliding_window_pattern={every} must be in 1..10000")
            fields["layer_pattern"] = "L" * (every - 1) + "G"
    else:  # nemotron_h
        pattern = cfg.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) > 10**5:
            raise ConfigError(f"{origin}: hybrid_override_pattern must be a string of M, * and - characters")
        bad = sorted({c for c in pattern if c not in _NEMOTRON_CHARS})[:3]
        if bad:
            raise ConfigError(f"{origin}: hybrid_override_pattern characters {bad} are not modelled "
                              "(M Mamba-2, * attention, - MLP)")
        fields.update(layer_pattern="".join(_NEMOTRON_CHARS[c] for c in pattern), activation="squared_relu",
                      ssm_state=num("ssm_state_size"), ssm_heads=num("mamba_num_heads"),
                      ssm_head_dim=num("mamba_head_dim"), ssm_groups=num("n_groups", 1),
                      ssm_conv=num("conv_kernel", 4), ssm_chunk=num("chunk_size", 256))
    return fields
