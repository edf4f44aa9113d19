"""Multi-head latent attention (DeepSeek-V3): parameters, FLOPs, KV cache and Hugging Face import."""

import json

import pytest

from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.model import load_model
from stageopt.model.kv_cache import kv_cache_bytes, layer_kv
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload

# deepseek-ai/DeepSeek-V3 config.json (the fields a training plan needs)
DSV3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
}
H, QL, KL, NH, DN, DR, DV = 7168, 1536, 512, 128, 128, 64, 128


def test_deepseek_v3_config_imports_like_the_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DSV3_CONFIG))
    imported = load_model(str(path), ["seq=4096"])
    preset = load_model("deepseek-v3")
    fields = ("layers", "dense_layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k",
              "expert_ffn", "shared_experts", "attention_type", "q_lora_rank", "kv_lora_rank", "qk_nope_dim",
              "qk_rope_dim", "v_head_dim", "seq", "router_groups", "router_group_topk")
    assert {f: getattr(imported, f) for f in fields} == {f: getattr(preset, f) for f in fields}
    assert (imported.mtp_layers, preset.mtp_layers) == (1, 0)  # the config's MTP module; the preset leaves it out


def test_mla_parameters_and_model_size():
    """Per layer: q_a H*QL + q_b QL*NH*(DN+DR) + kv_a H*(KL+DR) + kv_b KL*NH*(DN+DV) + o NH*DV*H + norms
    = 187.1M; the model has 671B parameters, 37B active (DeepSeek-V3 report)."""
    model = load_model("deepseek-v3")
    work = build_workload(model, Plan(), None)
    attn = H * QL + QL * NH * (DN + DR) + H * (KL + DR) + KL * NH * (DN + DV) + NH * DV * H + QL + KL
    dense_mlp = 3 * H * 18432 + 2 * H  # SwiGLU MLP plus the two layer norms
    assert work.value("dense", "params_dense") == attn + dense_mlp
    assert work.params_total == pytest.approx(671.0e9, rel=1e-3)
    assert work.params_active == pytest.approx(37.6e9, rel=1e-2)


def test_mla_forward_flops_per_token():
    """2 FLOPs per weight per token, plus attention over the whole s x s matrix: 2 s NH (DN+DR) for
    scores and 2 s NH DV for the weighted values, per token (tp=1, cp=1)."""
    model = load_model("deepseek-v3", ["seq=4096"])
    plan = Plan(mbs=1)
    block = compile_block("dense", arch_of(model, plan), "none")
    vals = block.evaluate(symbol_values(model, plan))
    s = 4096
    weights = H * QL + QL * NH * (DN + DR) + H * KL + H * DR + KL * NH * DN + KL * NH * DV + NH * DV * H
    attn = 2 * s * NH * (DN + DR) + 2 * s * NH * DV
    assert vals["fwd_attn_flops"] == s * attn
    assert vals["fwd_flops"] == s * (2 * weights + 2 * 3 * H * 18432 + attn)


def test_mla_kv_cache_is_the_latent_and_the_rotary_key():
    model = load_model("deepseek-v3")
    assert layer_kv(model).values_per_token == KL + DR == 576
    assert kv_cache_bytes(model, 4096) == 61 * 576 * 4096 * 2
    llama = load_model("llama3-70b")
    assert layer_kv(llama).values_per_token == 2 * 8 * 128


def test_mla_with_tp_gathers_latents_not_hidden_states():
    """Under sequence parallelism the down projections run on the sequence shard; TP gathers the 1536- and
    512-wide latents and the 64-wide rotary key instead of the 7168-wide hidden state."""
    model = load_model("deepseek-v3", ["seq=4096"])
    plan = Plan(tp=4, sp=True, mbs=1)
    block = compile_block("dense", arch_of(model, plan), "none")
    vals = block.evaluate(symbol_values(model, plan))
    gathers = {c.name: vals[block.names[c.index + 1]] for c in block.collectives
               if c.phase == "fwd" and c.kind == "all_gather" and c.axis == "tp"}
    per_token = 4096 * 2  # bf16, whole sequence after the gather
    assert gathers == {"all_gather:q_norm:tp": QL * per_token, "all_gather:kv_norm:tp": KL * per_token,
                       "all_gather:rope_k:tp": DR * per_token, "all_gather:ln2:tp": H * per_token}
