"""gpt-oss's terms as Megatron-Core runs them: expert biases, router bias, YaRN-scaled RoPE, clamped activation.

Independent figures: the parameter count of the openai/gpt-oss-120b checkpoint (Megatron-Bridge's
verification card for it exports 116,829,156,672 parameters), less the 36 x 64 attention sinks stageopt does
not model; the bytes of Megatron-Core's eager kernels, counted by hand from the PyTorch ops it runs: the fp32
expert-bias path (TEGroupedMLP._apply_bias), the unfused RoPE (rope_utils._apply_rotary_pos_emb_bshd) and
the clamp before the experts' activation (weighted_bias_quick_geglu_impl), with autograd's backward of each.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from stageopt.errors import ConfigError
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_op_table
from stageopt.graph.symbols import symbol_values
from stageopt.model.load import from_hf_config
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.run import workload_for

T, H, E, K = 256, 2880, 128, 4  # tokens of one micro-batch, hidden, experts, experts per token
SMALL = ["layers=2", f"seq={T}"]


def _bytes(model_set: list[str], name: str, phase: str = "fwd", plan: str = "tp=1 pp=1 dp=1 mbs=1 gbs=1") -> int:
    work = workload_for("gpt-oss-120b", plan, 1, model_set=model_set)
    program = build_stage_program(work, 0)
    return next(n.tensor_size for n in program.nodes if n.phase == phase and n.name.endswith(f":{name}"))


def _forward_bytes(model_set: list[str], name: str) -> int:
    return _bytes(model_set, name)


def test_parameters_match_the_published_checkpoint_less_the_attention_sinks() -> None:
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1)
    assert work.params_total == 116_829_156_672 - 36 * 64


def test_expert_output_bias_moves_28_bytes_an_element_forward_and_40_backward() -> None:
    routed = T * K * H  # elements of the routed output
    # forward, per expert: bias x fp32 probabilities (write 4), add to the bf16 output (2 + 4 + 4); then the fp32
    # pieces concatenated (4 + 4) and cast back (4 + 2); plus 7 reads of the bf16 bias table (E x H)
    assert _forward_bytes(SMALL, "expert.fc2_bias") == pytest.approx(28 * routed + 7 * 2 * E * H)
    # backward: the cast's (2 + 4), per expert the cast to bf16 (4 + 2), the probability and bias gradients (a
    # product, 4 + 4, and its reduction, 4, each), the concatenation of the output gradient (2 + 2); plus ten
    # writes of the bf16 bias gradient
    assert _bytes(SMALL, "dexpert.fc2_bias", "bwd") == pytest.approx(40 * routed + 10 * 2 * E * H)


def test_expert_output_bias_launches_what_its_per_expert_loop_launches() -> None:
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=8 ep=8 mbs=1 gbs=8", 8, model_set=SMALL)
    nodes = {(n.phase, n.name.split(":")[-1]): n.launches for n in build_stage_program(work, 0).nodes}
    local = E // 8  # experts on each of the 8 expert-parallel ranks
    # forward: bias x probabilities and the add per expert, then one concatenation and one cast
    assert nodes[("fwd", "expert.fc2_bias")] == 2 * local + 2
    # backward: the cast, then per expert a cast and two product-and-reduce gradients, then the concatenation
    assert nodes[("bwd", "dexpert.fc2_bias")] == 5 * local + 2
    # the analytical backend's op table counts the same kernels for the same plan
    arch = arch_of(work.model, work.plan)
    table = compile_op_table("moe", arch, work.plan.recompute)
    values = symbol_values(work.model, SimpleNamespace(mbs=1, tp=1, cp=1, ep=8, cpa=1))
    launches = table.evaluate(values)["launches"][:, 0].astype(int).tolist()
    assert 2 * local + 2 in launches and 5 * local + 2 in launches


def test_clamped_activation_adds_the_eager_clamp_and_its_backward() -> None:
    half = T * K * H  # elements of one half (gate or linear) of the experts' fc1 output
    # forward: each clamp reads and writes its half (2 + 2), the concatenation both halves (4 + 4): 16 in all
    assert 2 * _forward_bytes(SMALL, "expert.clamp_gate") == pytest.approx(16 * half)
    # backward: gate mask (x <= 7: 2 + 1) and where (1 + 2 + 2); linear half >=, <= (2 + 1 each), and (1 + 1 + 1),
    # where (1 + 2 + 2); the concatenation of the two gradients (4 + 4): 30 in all
    assert 2 * _bytes(SMALL, "dexpert.clamp_up", "bwd") == pytest.approx(30 * half)
    # recomputing moe_act re-runs the clamp with the activation
    plan = "tp=1 pp=1 dp=1 mbs=1 gbs=1 recompute=selective recompute_modules=moe_act"
    assert _bytes(SMALL, "expert.clamp_gate", "recompute", plan) == _forward_bytes(SMALL, "expert.clamp_gate")
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=[*SMALL, "activation_clamp=0"])
    assert not any("clamp" in n.name for n in build_stage_program(work, 0).nodes)
    with pytest.raises(ConfigError, match="activation_clamp"):
        workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=[*SMALL, "activation=gelu"])


def test_biases_add_the_checkpoints_bias_parameters() -> None:
    work_on = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=SMALL)
    work_off = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, model_set=[*SMALL, "bias=false"])
    per_layer = E * 2 * H + E * H + E + 64 * 64 + 2 * 8 * 64 + H  # experts' fc1 and fc2, router, q, k and v, proj
    assert work_on.params_total - work_off.params_total == 2 * per_layer


def test_yarn_scaled_rope_runs_unfused_on_megatron_core() -> None:
    q_bytes, k_bytes = T * 64 * 64 * 2, T * 8 * 64 * 2  # bf16 queries and keys of one micro-batch
    # YaRN's mscale 1.3466: t*cos (1 + 1 tensor), -x2 (1/2 + 1/2), rotate-half cat (1 + 1), *sin (1 + 1),
    # add (2 + 1), cat with the empty pass-through part (1 + 1): 12 tensors, six passes
    assert _forward_bytes(SMALL, "rope_q") == pytest.approx(6 * 2 * q_bytes)
    # backward: *sin (1 + 1), neg (1/2 + 1/2), the chunk's cat (1 + 1), *cos (1 + 1), the two gradients summed
    # (2 + 1), the slice's zero fill and copy (1 + 1 + 1): 13 tensors
    assert _bytes(SMALL, "drope_q", "bwd") == pytest.approx(13 * q_bytes)
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
    assert from_hf_config({**base, "swiglu_limit": 7.0})["activation_clamp"] == 7.0
    assert from_hf_config(base)["activation_clamp"] == 0.0
    with pytest.raises(ConfigError, match="swiglu_limit"):
        from_hf_config({**base, "swiglu_limit": "seven"})
    with pytest.raises(ConfigError, match="rope_scaling.factor"):
        from_hf_config({**base, "rope_scaling": {**yarn, "factor": -2}})


def _automodel_bytes(name: str, phase: str = "fwd") -> int:
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, framework="nemo-automodel-te", model_set=SMALL)
    return next(n.tensor_size for n in build_stage_program(work, 0).nodes
                if n.phase == phase and n.name.endswith(f":{name}"))


def test_automodel_adds_expert_biases_eagerly_in_bf16_and_clamps_inside_its_compiled_activation() -> None:
    """NeMo AutoModel's DeepEP experts (GroupedExpertsDeepEP._apply_bias, quick_geglu_deepep under torch.compile)."""
    routed, half = T * K * H, T * K * H  # elements of the routed output and of one half of fc1's
    # fc2 bias, per expert: bias x probabilities (write 2), add to the output (2 + 2 + 2), concatenation (2 + 2)
    assert _automodel_bytes("expert.fc2_bias") == pytest.approx(12 * routed + 3 * 2 * E * H)
    # backward: split's gradient concatenated (2 + 2); bias gradient: product with the probabilities (2 + 2) and its
    # reduction (2); probability gradient: product with the bias (2 + 2) and its reduction (2)
    assert _automodel_bytes("dexpert.fc2_bias", "bwd") == pytest.approx(16 * routed + 4 * 2 * E * H)
    # fc1 bias, each half: add (2 + 2) and concatenation (2 + 2); backward, the concatenation (2 + 2) and the
    # bias gradient's reduction (2)
    assert _automodel_bytes("expert.gate_bias") == pytest.approx(8 * half + 2 * 2 * E * H)
    assert _automodel_bytes("dexpert.up_bias", "bwd") == pytest.approx(6 * half + 1.5 * 2 * E * H)
    work = workload_for("gpt-oss-120b", "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, framework="nemo-automodel-te",
                        model_set=SMALL)
    assert not any("clamp" in n.name for n in build_stage_program(work, 0).nodes)
