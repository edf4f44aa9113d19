"""Hugging Face configs of further families (Gemma, OLMo 2, Phi-3, Granite, Cohere, StarCoder2) against closed-form
parameter counts written out here from each config (and Gemma 2B's published non-embedding count)."""

from __future__ import annotations

import json

import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload

GEMMA_2B = {"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000,
            "max_position_embeddings": 8192}
STARCODER2_3B = {"model_type": "starcoder2", "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
                 "num_attention_heads": 24, "num_key_value_heads": 2, "vocab_size": 49152, "use_bias": True,
                 "sliding_window": 4096, "max_position_embeddings": 16384, "tie_word_embeddings": True}
COHERE_SMALL = {"model_type": "cohere", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4,
                "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
                "max_position_embeddings": 8192}


def _load(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


def _params(model) -> float:
    return build_workload(model, Plan.parse("tp=1")).params_total


def test_gemma_2b_ties_its_embedding_by_default_and_matches_the_published_count(tmp_path):
    """Per layer: Q and O 2048 x (8 x 256) each, K and V 2048 x 256 each (one KV head), a gated MLP 3 x 2048 x
    16384, two norms; with the final norm 1,981,884,416 non-embedding parameters, the Gemma report's figure for
    Gemma 2B; plus one tied 256000 x 2048 embedding (the config's vocabulary): 2,506,172,416."""
    model = _load(tmp_path, GEMMA_2B)
    assert (model.tied_embeddings, model.kv_heads, model.dim_per_head) == (True, 1, 256)
    h, layer = 2048, 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 16384 + 2 * 2048
    assert 18 * layer + h == 1_981_884_416
    assert 18 * layer + h + 256000 * h == 2_506_172_416 == _params(model)


def test_starcoder2_3b_windows_every_layer_and_matches_the_published_count(tmp_path):
    """LayerNorm (weight and bias), biased QKV/output/MLP, GQA with 2 KV heads of 128, plain 4h GELU MLP, tied
    embedding: 3,030,371,328 parameters by the closed form of StarCoder2-3B's config."""
    model = _load(tmp_path, STARCODER2_3B)
    assert (model.norm, model.activation, model.bias, model.layer_pattern, model.sliding_window) == (
        "layernorm", "gelu", True, "L", 4096)
    h, f, kv = 3072, 12288, 2 * 128
    layer = (h * h + h) * 2 + 2 * (h * kv + kv) + (h * f + f) + (f * h + h) + 2 * 2 * h
    assert 30 * layer + 49152 * h + 2 * h == 3_030_371_328 == _params(model)


def test_cohere_runs_attention_and_mlp_side_by_side_from_one_norm(tmp_path):
    model = _load(tmp_path, COHERE_SMALL)
    assert (model.parallel_block, model.activation, model.tied_embeddings, model.kv_heads) == (
        "shared_norm", "swiglu", True, 4)
    h, f, kv = 1024, 4096, 4 * 64
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # one LayerNorm (priced with a bias) per layer
    assert 4 * layer + 32000 * h + 2 * h == _params(model)


@pytest.mark.parametrize("kind", ["olmo", "olmo2", "phi3", "granite"])
def test_llama_shaped_families_import_as_llama(tmp_path, kind):
    cfg = {"model_type": kind, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096}
    model = _load(tmp_path, cfg)
    assert (model.family, model.norm, model.activation, model.tied_embeddings) == ("llama", "rmsnorm", "swiglu", False)
    h, f, kv = 512, 1536, 2 * 64
    # OLMo 2 normalizes queries and keys (q_norm over the 512 query channels, k_norm over the 128 key channels);
    # stageopt prices them as per-head norms, one 64-wide weight each (same bytes moved, 2 x 64 weights a layer)
    qk_norms = 2 * 64 if kind == "olmo2" else 0
    assert model.qk_norm == (kind == "olmo2")
    assert _params(model) == 2 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h + qk_norms) + 2 * 1000 * h + h
