"""Activation memory per GPT layer vs Korthikanti et al. 2022, Table 2 (fp16, with dropout).

The paper's stack is Megatron-LM of 2021-22 (eager attention, dropout), so the
plans name that framework profile rather than editing the model.
"""

import pytest

from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.model import load_model
from stageopt.parallel.plan import Plan

S, B, H, A = 2048, 1, 12288, 96


def layer_bytes(plan_text: str) -> float:
    model = load_model("gpt3-175b")
    plan = Plan.parse(plan_text, framework=load_profile("megatron-lm-2021"))
    block = compile_block("dense", arch_of(model, plan), plan.recompute)
    return float(block.evaluate(symbol_values(model, plan))["saved_bytes"])


def test_no_parallelism():
    assert layer_bytes("tp=1 mbs=1") == pytest.approx(S * B * H * (34 + 5 * A * S / H), rel=0.01)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel(t):
    want = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert layer_bytes(f"tp={t} mbs=1") == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("t", [2, 8])
def test_tensor_and_sequence_parallel(t):
    want = S * B * H / t * (34 + 5 * A * S / H)
    assert layer_bytes(f"tp={t} sp=on mbs=1") == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("t", [2, 8])
def test_selective_recompute_with_sequence_parallel(t):
    want = S * B * H * 34 / t
    assert layer_bytes(f"tp={t} sp=on recompute=selective mbs=1") == pytest.approx(want, rel=0.01)


def test_full_recompute_keeps_only_the_layer_input():
    assert layer_bytes("tp=8 recompute=full mbs=1") == pytest.approx(2 * S * B * H, rel=0.01)


def test_micro_batch_scales_linearly():
    assert layer_bytes("tp=1 mbs=4") == pytest.approx(4 * layer_bytes("tp=1 mbs=1"), rel=1e-9)
