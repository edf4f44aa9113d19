"""Sliding-window/global attention mixes (GPT-OSS, Gemma 3) and Mamba-2 hybrids (Nemotron-H):
FLOPs, layer placement, caches and Hugging Face import."""

import json
from collections import Counter

import pytest

from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.model import load_model
from stageopt.model.kv_cache import kv_cache_bytes, layer_kv
from stageopt.model.layer_types import layer_kinds
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload, stage_memory


def block_values(model, kind, plan=None):
    plan = plan or Plan(mbs=1)
    return compile_block(kind, arch_of(model, plan), "none").evaluate(symbol_values(model, plan))


def test_sliding_window_attention_computes_the_causal_band():
    """A window W over S tokens: 2 (2WS - W^2) b h d per head pair count (the MFU convention counts causal
    attention as the whole s x s matrix; a window keeps the band), the GEMMs are unchanged."""
    model = load_model("gemma3-27b", ["seq=8192"])
    full, local = block_values(model, "dense"), block_values(model, "swa")
    s, w, heads, d = 8192, 1024, 32, 128
    per_matrix = 4 * s * s * heads * d  # Q K^T and P V over the whole matrix
    assert full["fwd_attn_flops"] == per_matrix
    assert local["fwd_attn_flops"] == pytest.approx(per_matrix * (2 * w * s - w * w) / s**2, rel=1e-12)
    assert full["fwd_flops"] - full["fwd_attn_flops"] == local["fwd_flops"] - local["fwd_attn_flops"]


def test_gemma3_has_one_global_layer_in_six_and_caches_only_windows():
    model = load_model("gemma3-27b")
    kinds = Counter(layer_kinds(model))
    assert kinds == {"swa": 52, "dense": 10}
    assert layer_kv(model, 0).tokens_kept(32768) == 1024 and layer_kv(model, 5).tokens_kept(32768) == 32768
    per_token = 2 * 16 * 128  # K and V of 16 KV heads of 128
    assert kv_cache_bytes(model, 32768) == 2 * per_token * (52 * 1024 + 10 * 32768)


def test_mamba2_flops_per_token():
    """Per token: 2 x weights (in/out projections) plus SSD: 2 Q N per group (C B^T), 2 Q P, 2 P N and
    2 P N per head (chunk Q, state N, head dim P); conv and gates are vector work."""
    model = load_model("nemotron-h-8b", ["seq=8192"])
    vals = block_values(model, "mamba")
    h, heads, p, n, groups, q, s = 4096, 128, 64, 128, 8, 128, 8192
    weights = h * (2 * heads * p + 2 * groups * n + heads) + heads * p * h
    ssd = 2 * q * groups * n + 2 * q * heads * p + 4 * heads * p * n
    assert vals["fwd_flops"] == s * (2 * weights + ssd)


def test_nemotron_h_layers_params_and_state():
    model = load_model("nemotron-h-8b")
    assert Counter(layer_kinds(model)) == {"mamba": 24, "attn": 4, "mlp": 24}
    work = build_workload(model, Plan(tp=2, pp=2, mbs=1, gbs=8, dp=1), 4)
    assert work.params_total == pytest.approx(8.1e9, rel=0.01)
    mamba = layer_kv(model, 0)
    assert mamba.values(1) == mamba.values(100_000) == 128 * 64 * 128 + (128 * 64 + 2 * 8 * 128) * 3
    with pytest.raises(InfeasiblePlan, match="context parallelism"):
        build_workload(model, Plan(cp=2, mbs=1, gbs=2, dp=1), 2)
    with pytest.raises(InfeasiblePlan, match="ssm_groups=1"):
        build_workload(load_model("nemotron-h-8b", ["ssm_groups=1"]), Plan(tp=2, mbs=1, gbs=1, dp=1), 2)


@pytest.mark.parametrize("name, plan, gpus", [("nemotron-h-8b", "tp=2 pp=4 mbs=1 gbs=16", 8),
                                              ("gpt-oss-120b", "pp=4 ep=4 mbs=1 gbs=32 schedule=interleaved vpp=3", 16),
                                              ("gemma3-27b", "tp=4 pp=2 mbs=1 gbs=8 zero=1", 16)])
def test_analytical_memory_equals_the_workload_on_hybrids(name, plan, gpus):
    model = load_model(name, ["seq=4096"])
    work = build_workload(model, Plan.parse(plan, gpus=gpus), gpus)
    res = evaluate_plans(model, hardware_for("h100-sxm"), [work.plan])
    peak = max(stage_memory(work, s).total for s in range(work.plan.pp)) / 2**30
    assert res["mem_total"][0] == pytest.approx(peak, rel=1e-9)


NEMOTRON_H_CONFIG = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 4096,
    "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
    "intermediate_size": 21504, "vocab_size": 131072, "max_position_embeddings": 8192,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "ssm_state_size": 128,
    "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
    "mlp_hidden_act": "relu2", "tie_word_embeddings": False}
GPT_OSS_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
    "num_local_experts": 128, "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128,
    "attention_bias": True, "max_position_embeddings": 131072, "tie_word_embeddings": False, "swiglu_limit": 7.0,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False}}
GEMMA3_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"hidden_size": 5376, "num_hidden_layers": 62, "num_attention_heads": 32,
                    "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 262208,
                    "sliding_window": 1024, "sliding_window_pattern": 6, "max_position_embeddings": 131072}}


@pytest.mark.parametrize("config, preset", [(NEMOTRON_H_CONFIG, "nemotron-h-8b"), (GPT_OSS_CONFIG, "gpt-oss-120b"),
                                            (GEMMA3_CONFIG, "gemma3-27b")])
def test_hugging_face_configs_import_like_the_presets(tmp_path, config, preset):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    imported, expected = load_model(str(path), ["seq=4096"]), load_model(preset, ["seq=4096"])
    assert layer_kinds(imported) == layer_kinds(expected)
    same = ("layers", "hidden", "heads", "kv_heads", "dim_per_head", "ffn", "vocab", "experts", "top_k", "expert_ffn",
            "sliding_window", "ssm_state", "ssm_heads", "ssm_head_dim", "ssm_groups", "ssm_chunk", "tied_embeddings",
            "bias", "activation", "rope_mscale", "activation_clamp", "qk_norm")
    assert {f: getattr(imported, f) for f in same} == {f: getattr(expected, f) for f in same}


def test_bad_patterns_are_one_line_errors():
    with pytest.raises(ConfigError, match="layer_pattern"):
        load_model("llama3-8b", ["layer_pattern=GX"])
    with pytest.raises(ConfigError, match="sliding_window"):
        load_model("llama3-8b", ["layer_pattern=LG"])
    with pytest.raises(ConfigError, match="ssm_state"):
        load_model("llama3-8b", ["layer_pattern=mf"])
