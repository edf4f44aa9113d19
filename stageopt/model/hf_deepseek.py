"""Hugging Face configs of DeepSeek-V2/V3 (``model_type`` deepseek_v2, deepseek_v3) as ModelSpec fields.

Why apart from :mod:`stageopt.model.load`: these configs carry multi-head latent
attention (q/kv low-rank dimensions, split rotary and non-rotary head
dimensions) and fine-grained MoE with shared experts and leading dense layers,
fields no other family has. Multi-token-prediction modules
(``num_nextn_predict_layers``) are not modelled: the spec is the main model.
``num`` and ``flag`` are load.py's type-checked readers of the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stageopt.errors import ConfigError

DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")


def deepseek_fields(cfg: dict[str, Any], origin: str, num: Callable[..., int],
                    flag: Callable[[str, bool], bool]) -> dict[str, Any]:
    """ModelSpec fields of a DeepSeek-V2/V3 config (the training ``seq`` comes from load.py)."""
    freq = num("moe_layer_freq", 1)
    if freq != 1:
        raise ConfigError(f"{origin}: moe_layer_freq={freq} (MoE every {freq} layers) is not modelled; "
                          "stageopt models dense leading layers then MoE in every layer")
    heads = num("num_attention_heads")
    named = cfg.get("_name_or_path")
    fields: dict[str, Any] = {
        "name": named if isinstance(named, str) and named else str(cfg["model_type"]),
        "family": "moe" if num("n_routed_experts", 0) else "llama",
        "layers": num("num_hidden_layers"), "hidden": num("hidden_size"), "heads": heads, "kv_heads": heads,
        "ffn": num("intermediate_size"), "vocab": num("vocab_size"),
        "tied_embeddings": flag("tie_word_embeddings", False),
        "attention_type": "mla", "q_lora_rank": num("q_lora_rank", 0), "kv_lora_rank": num("kv_lora_rank"),
        "qk_nope_dim": num("qk_nope_head_dim"), "qk_rope_dim": num("qk_rope_head_dim"), "v_head_dim": num("v_head_dim"),
    }
    if num("n_routed_experts", 0):
        fields.update(experts=num("n_routed_experts"), top_k=num("num_experts_per_tok"),
                      expert_ffn=num("moe_intermediate_size"), shared_experts=num("n_shared_experts", 0),
                      dense_layers=num("first_k_dense_replace", 0), router_groups=num("n_group", 0),
                      router_group_topk=num("topk_group", 0))
    fields["mtp_layers"] = num("num_nextn_predict_layers", 0)  # trained with them; a layout then needs an m
    return fields
