"""gpt-oss's terms as Megatron-Core runs them: expert biases, router bias, YaRN-scaled RoPE.

Independent figures: the parameter count of the openai/gpt-oss-120b checkpoint (Megatron-Bridge's
verification card for it exports 116,829,156,672 parameters), less the 36 x 64 attention sinks stageopt does
not model; the bytes of Megatron-Core's fp32 expert-bias path (TEGroupedMLP._apply_bias) and of an unfused
three-pass RoPE, counted by hand.
"""

from __future__ import annotations

import math

import pytest

from stageopt.errors import ConfigError
from stageopt.model.load import from_hf_config
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.run import workload_for

T, H, E, K = 256, 2880, 128, 4  # tokens of one micro-batch, hidden, experts, experts per token
SMALL = ["layers=2", f"seq={T}"]


def _forward_bytes(model_set: list[str], name: str) -> int:
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=model_set)
    program = build_stage_program(work, 0)
    return next(n.tensor_size for n in program.nodes if n.phase == "fwd" and n.name.endswith(f":{name}"))


def test_parameters_match_the_published_checkpoint_less_the_attention_sinks() -> None:
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1)
    assert work.params_total == 116_829_156_672 - 36 * 64


def test_expert_output_bias_moves_36_bytes_an_element_in_fp32() -> None:
    # cast up (2 + 4), expand the bias rows (4), scale them (4 + 4), add (8 + 4), cast back (4 + 2) bytes an
    # element of the routed output (T x K rows of H), plus 4.5 reads of the bf16 bias table (E x H)
    expected = 36 * T * K * H + 4.5 * 2 * E * H
    assert _forward_bytes(SMALL, "expert.fc2_bias") == pytest.approx(expected)


def test_biases_add_the_checkpoints_bias_parameters() -> None:
    work_on = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=SMALL)
    work_off = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=[*SMALL, "bias=false"])
    per_layer = E * 2 * H + E * H + E + 64 * 64 + 2 * 8 * 64 + H  # experts' fc1 and fc2, router, q, k and v, proj
    assert work_on.params_total - work_off.params_total == 2 * per_layer


def test_yarn_scaled_rope_runs_unfused_on_megatron_core() -> None:
    q_bytes, k_bytes = T * 64 * 64 * 2, T * 8 * 64 * 2  # bf16 queries and keys of one micro-batch
    # YaRN's mscale 1.3466: three passes, each reading and writing the queries
    assert _forward_bytes(SMALL, "rope_q") == pytest.approx(3 * 2 * q_bytes)
    # no scaling: Transformer Engine's fused kernel rotates queries and keys in one pass
    assert _forward_bytes([*SMALL, "rope_mscale=1"], "rope_q+rope_k") == pytest.approx(2 * (q_bytes + k_bytes))


def test_hugging_face_yarn_scaling_gives_megatrons_concentration() -> None:
    base = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
            "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128}
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0}
    assert from_hf_config({**base, "rope_scaling": yarn})["rope_mscale"] == pytest.approx(0.1 * math.log(32) + 1)
    deepseek_like = {**yarn, "mscale": 1.0, "mscale_all_dim": 1.0}  # the ratio of equal factors: no scaling
    assert "rope_mscale" not in from_hf_config({**base, "rope_scaling": deepseek_like})
    assert from_hf_config({**base, "rope_scaling": {**yarn, "attention_factor": 1.2}})["rope_mscale"] == 1.2
    assert "rope_mscale" not in from_hf_config({**base, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    with pytest.raises(ConfigError, match="rope_scaling.factor"):
        from_hf_config({**base, "rope_scaling": {**yarn, "factor": -2}})
