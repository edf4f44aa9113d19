"""Hugging Face configs: Qwen2-MoE / Qwen3-MoE, and the stated training sequence length.

Parameter counts are checked twice: against a closed form written out here from
the config (embeddings, attention, experts), and against the totals the model
authors publish (Qwen3 technical report; Qwen1.5-MoE / Qwen2 model cards).
"""

from __future__ import annotations

import json

import pytest

from stageopt.cli import main
from stageopt.errors import ConfigError
from stageopt.model import load_model
from stageopt.model.load import HF_DEFAULT_SEQ
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload

QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}
QWEN15_MOE_A27B = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
                   "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
                   "num_key_value_heads": 16, "vocab_size": 151936, "max_position_embeddings": 8192,
                   "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                   "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "tie_word_embeddings": False}
LLAMA31_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
               "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
               "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
               "tie_word_embeddings": False}


def _write(tmp_path, cfg: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _params(source: str, sets: list[str] | None = None) -> tuple[float, float]:
    work = build_workload(load_model(source, sets or []), Plan.parse("tp=1"))
    return work.params_total, work.params_active


def _closed_form(h, layers, heads, kv, d, vocab, experts, top_k, fe, shared_ffn=0):
    """Weights of a decoder without biases or norms: untied embeddings, GQA attention, SwiGLU experts."""
    attn = h * heads * d * 2 + h * kv * d * 2  # q, o and k, v projections
    expert = 3 * h * fe
    router = h * experts
    shared = 3 * h * shared_ffn
    total = 2 * vocab * h + layers * (attn + experts * expert + router + shared)
    active = 2 * vocab * h + layers * (attn + top_k * expert + router + shared)
    return total, active


def test_qwen3_moe_matches_the_closed_form_and_the_published_30b_a3b(tmp_path):
    m = load_model(_write(tmp_path, QWEN3_30B_A3B))
    assert (m.family, m.experts, m.top_k, m.expert_ffn, m.shared_experts, m.dense_layers) == ("moe", 128, 8, 768, 0, 0)
    assert (m.head_dim, m.kv_heads) == (128, 4)
    total, active = _params(_write(tmp_path, QWEN3_30B_A3B))
    want_total, want_active = _closed_form(2048, 48, 32, 4, 128, 151936, 128, 8, 768)
    assert total == pytest.approx(want_total, rel=1e-4) and active == pytest.approx(want_active, rel=1e-4)
    assert total == pytest.approx(30.5e9, rel=0.01) and active == pytest.approx(3.3e9, rel=0.02)


def test_qwen2_moe_shared_expert_becomes_whole_experts(tmp_path):
    m = load_model(_write(tmp_path, QWEN15_MOE_A27B))
    assert (m.experts, m.top_k, m.expert_ffn, m.shared_experts) == (60, 4, 1408, 4)  # 5632 = 4 x 1408
    total, active = _params(_write(tmp_path, QWEN15_MOE_A27B))
    want_total, want_active = _closed_form(2048, 24, 16, 16, 128, 151936, 60, 4, 1408, shared_ffn=5632)
    assert total == pytest.approx(want_total, rel=1e-3) and active == pytest.approx(want_active, rel=1e-3)
    assert total == pytest.approx(14.3e9, rel=0.01) and active == pytest.approx(2.7e9, rel=0.01)


def test_leading_dense_layers_are_kept_and_others_refused(tmp_path):
    assert load_model(_write(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [1, 0]})).dense_layers == 2
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        load_model(_write(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [5]}))
    with pytest.raises(ConfigError, match="decoder_sparse_step=2"):
        load_model(_write(tmp_path, {**QWEN3_30B_A3B, "decoder_sparse_step": 2}))
    with pytest.raises(ConfigError, match="shared_expert_intermediate_size=5000"):
        load_model(_write(tmp_path, {**QWEN15_MOE_A27B, "shared_expert_intermediate_size": 5000}))


def test_training_length_is_the_stated_default_not_the_context_limit(tmp_path, capsys):
    path = _write(tmp_path, LLAMA31_70B)
    assert load_model(path).seq == HF_DEFAULT_SEQ == 4096
    assert load_model(path, ["seq=131072"]).seq == 131072
    plan = "tp=8 pp=4 mbs=1 gbs=512 zero=1 sp=on"
    assert main(["inspect", "--model", path, "--plan", plan, "--gpus", "512", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["peak_memory_gib"] < 80  # at 131,072 tokens it would be hundreds of GiB
    assert "seq=4096 assumed" in err and "max_position_embeddings=131072" in err and "--set seq=N" in err
    assert main(["inspect", "--model", path, "--set", "seq=8192", "--plan", plan, "--gpus", "512", "--json"]) == 0
    assert "assumed" not in capsys.readouterr().err  # the user said it: nothing to note


def test_a_shorter_position_limit_caps_the_default(tmp_path, capsys):
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    path = _write(tmp_path, gpt2)
    assert load_model(path).seq == 1024
    assert main(["inspect", "--model", path, "--plan", "tp=1 mbs=1 gbs=8", "--gpus", "8", "--json"]) == 0
    assert "seq=1024 assumed (the config's n_positions=1024" in capsys.readouterr().err
