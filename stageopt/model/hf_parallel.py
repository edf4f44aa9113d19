"""Hugging Face configs of parallel-block models as ModelSpec fields: GPT-NeoX, Falcon and Cohere (Command R).

Why apart from :mod:`stageopt.model.load`: these families compute attention and the MLP side by side
(``ModelSpec.parallel_block``) and say so, and how many norms feed the two branches, in family-specific keys
(GPT-NeoX ``use_parallel_residual``; Falcon ``parallel_attn``, ``new_decoder_architecture`` and
``num_ln_in_parallel_attn``; Cohere always, from one shared norm). Stated approximations: GPT-NeoX's partial
rotary embedding (``rotary_pct``) is priced as RoPE over whole heads, a few elementwise passes over Q and K;
Cohere's bias-free LayerNorm counts a bias (h parameters a norm) and its optional query/key norms are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stageopt.errors import ConfigError

PARALLEL_TYPES = ("gpt_neox", "falcon", "cohere")


def parallel_fields(cfg: dict[str, Any], origin: str, num: Callable[..., int],
                    flag: Callable[[str, bool], bool]) -> dict[str, Any]:
    """ModelSpec fields of a GPT-NeoX, Falcon or Cohere config (the training ``seq`` comes from load.py).

    ``num`` and ``flag`` are load.py's type-checked readers of the config.
    """
    kind = str(cfg["model_type"])
    named = cfg.get("_name_or_path")
    hidden, heads = num("hidden_size"), num("num_attention_heads")
    fields: dict[str, Any] = {"name": named if isinstance(named, str) and named else kind, "family": "gpt",
                              "layers": num("num_hidden_layers"), "hidden": hidden, "heads": heads,
                              "vocab": num("vocab_size"), "norm": "layernorm", "activation": "gelu",
                              "position": "rope"}
    if kind == "gpt_neox":
        fields.update(kv_heads=heads, ffn=num("intermediate_size"), bias=flag("attention_bias", True),
                      tied_embeddings=flag("tie_word_embeddings", False),
                      parallel_block="two_norms" if flag("use_parallel_residual", True) else "off")
        return fields
    if kind == "cohere":
        fields.update(family="llama", activation="swiglu", kv_heads=num("num_key_value_heads", heads),
                      ffn=num("intermediate_size"), bias=flag("attention_bias", False),
                      tied_embeddings=flag("tie_word_embeddings", True), parallel_block="shared_norm")
        return fields
    if flag("alibi", False):
        raise ConfigError(f"{origin}: Falcon with alibi=true is not modelled (stageopt prices learned or rotary "
                          "positions); write a stageopt YAML with position: rope for an estimate")
    new_arch = flag("new_decoder_architecture", False)
    kv_heads = num("num_kv_heads", heads) if new_arch else 1 if flag("multi_query", True) else heads
    norms = num("num_ln_in_parallel_attn", 2 if new_arch else 1)
    if norms not in (1, 2):
        raise ConfigError(f"{origin}: num_ln_in_parallel_attn={norms} must be 1 or 2")
    fields.update(kv_heads=kv_heads, ffn=num("ffn_hidden_size", 4 * hidden), bias=flag("bias", False),
                  tied_embeddings=flag("tie_word_embeddings", True),
                  parallel_block=("shared_norm" if norms == 1 else "two_norms") if flag("parallel_attn", True)
                  else "off")
    return fields
