"""Activation memory of FP8 training: each FP8 GEMM's input is saved as its 1-byte FP8 copy.

Transformer Engine's Linear keeps the quantized input (column-wise) for the
weight gradient, not the BF16 tensor; a tensor another backward op also reads
(the attention output, read by the flash backward) keeps both forms. Derived
by hand from Korthikanti et al. 2022's per-layer inventory (34 sbh + 5 as^2
bytes in 16-bit) and, for a Llama layer, from the tensors each backward reads.
"""

import pytest

from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block, saved_bytes_key
from stageopt.graph.symbols import symbol_values
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.run import simulate_plan


def layer_bytes(model_name: str, framework: str, plan_text: str) -> dict[str, float]:
    model = load_model(model_name)
    plan = Plan.parse(plan_text, framework=load_profile(framework))
    values = compile_block("dense", arch_of(model, plan), plan.recompute).evaluate(symbol_values(model, plan))
    return {"bf16": float(values["saved_bytes"]), "fp8": float(values["saved_bytes_fp8"]),
            "sbh": model.seq * model.hidden, "as/h": model.heads * model.seq / model.hidden}


def test_gpt_layer_saves_its_four_gemm_inputs_in_one_byte():
    # 16-bit: 34 sbh + 5 as^2. In FP8 the QKV input (2 sbh), the projection input (2 sbh), the fc1 input
    # (2 sbh) and the fc2 input (8 sbh) halve; eager attention's V and probabilities stay 16-bit.
    got = layer_bytes("gpt3-175b", "megatron-lm-2021", "tp=1 mbs=1 dtype=fp8")
    assert got["bf16"] == pytest.approx(got["sbh"] * (34 + 5 * got["as/h"]), rel=1e-9)
    assert got["fp8"] == pytest.approx(got["sbh"] * (34 - 7 + 5 * got["as/h"]), rel=1e-9)


@pytest.mark.parametrize("t", [2, 8])
def test_sequence_parallel_saves_the_fp8_shard(t):
    got = layer_bytes("gpt3-175b", "megatron-lm-2021", f"tp={t} sp=on mbs=1 dtype=fp8")
    assert got["fp8"] == pytest.approx(got["sbh"] / t * (27 + 5 * got["as/h"]), rel=1e-9)


def test_llama_layer_keeps_both_forms_of_the_attention_output():
    # Per token, 16-bit: x, ln1, q, k, v, attention output, residual, ln2, gate, up, swiglu output =
    # 2 (6h + 2 kv + 3 ffn). FP8: ln1, ln2 and the swiglu output drop to one byte; the attention output
    # adds a one-byte copy beside the 16-bit one the flash backward reads.
    model = load_model("llama3-70b")
    h, kv, f = model.hidden, model.kv_heads * model.hidden // model.heads, model.ffn
    got = layer_bytes("llama3-70b", "megatron-core", "tp=1 mbs=1 dtype=fp8")
    per_token = got["bf16"] / model.seq
    assert per_token == pytest.approx(2 * (6 * h + 2 * kv + 3 * f), rel=1e-9)
    assert got["fp8"] / model.seq == pytest.approx(per_token - (h + h + f) + h, rel=1e-9)


def test_bf16_plans_are_unchanged_and_fp8_plans_use_the_fp8_figure():
    te = load_profile("megatron-core")
    assert saved_bytes_key(Plan.parse("dtype=bf16", framework=te)) == "saved_bytes"
    assert saved_bytes_key(Plan.parse("dtype=fp8", framework=te)) == "saved_bytes_fp8"
    # torchao's Float8Linear keeps the bf16 input and casts again in backward
    assert saved_bytes_key(Plan.parse("dtype=fp8", framework=load_profile("torchtitan"))) == "saved_bytes"
    plan = "tp=4 pp=2 dp=1 mbs=1 gbs=8 sp=on recompute=none"
    _, bf16 = simulate_plan("llama3-70b", f"{plan} dtype=bf16", None, hardware="h100-sxm")
    _, fp8 = simulate_plan("llama3-70b", f"{plan} dtype=fp8", None, hardware="h100-sxm")
    bf16_layer = layer_bytes("llama3-70b", "megatron-core", "tp=4 sp=on mbs=1 dtype=bf16")
    fp8_layer = layer_bytes("llama3-70b", "megatron-core", "tp=4 sp=on mbs=1 dtype=fp8")
    ratio = fp8.memory_breakdown_gib["activations"] / bf16.memory_breakdown_gib["activations"]
    assert ratio == pytest.approx(fp8_layer["fp8"] / bf16_layer["bf16"], rel=0.02)  # layers dominate the stage
    assert ratio < 0.9
