"""The serving graph against closed forms: KV cache, weights, attention FLOPs, and the fast step timer."""

from __future__ import annotations

import pytest

from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.serving.kv_memory import GIB, instance_memory
from stageopt.serving.serve_plan import Pool
from stageopt.serving.step_time import StepModel, StepShape
from stageopt.serving.step_timer import StepTimer


@pytest.fixture(scope="module")
def llama70():
    return load_model("llama3-70b", [])


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


@pytest.mark.parametrize("tp, heads_per_rank", [(1, 8), (4, 2), (8, 1), (16, 1)])
def test_kv_cache_per_token_is_gqa_closed_form(llama70, h100, tp, heads_per_rank):
    # K and V, kv heads on this rank (replicated once tp exceeds them), head dim 128, bf16, 80 layers
    mem = instance_memory(StepModel(llama70, h100, Pool(tp=tp)), 10_000)
    assert mem.kv_per_token == 2 * heads_per_rank * 128 * 2 * 80


def test_kv_cache_of_multi_head_model_and_fp8(h100):
    gpt = load_model("gpt3-175b", [])
    mem = instance_memory(StepModel(gpt, h100, Pool(tp=8), kvdtype="fp8"), 10_000)
    assert mem.kv_per_token == 2 * (96 // 8) * 128 * 1 * 96


def test_weights_per_rank_match_parameter_count(llama70, h100):
    h, g, d, f, v, layers = 8192, 8, 128, 28672, 128256, 80
    per_layer = h * (h + 2 * g * d) + h * h + 3 * h * f + 2 * h  # q,k,v; o; gate, up, down; two norms
    total = layers * per_layer + 2 * v * h + h  # embedding, output layer, final norm
    mem = instance_memory(StepModel(llama70, h100, Pool(tp=8)), 80)
    # norms are replicated on every rank, everything else split 8 ways
    expected = (total - (2 * layers + 1) * h) / 8 + (2 * layers + 1) * h
    assert mem.weights == pytest.approx(expected * 2, rel=1e-9)
    assert mem.kv_budget == pytest.approx(80 * GIB * 0.9 - mem.weights - mem.workspace)


def test_decode_attention_flops_per_pair(llama70, h100):
    timer = StepTimer(StepModel(llama70, h100, Pool(tp=8)), 64, 8)
    assert timer.flops_per_pair == 4 * (64 // 8) * 128  # QK^T and PV, 2 FLOPs per multiply-add
    assert timer.bytes_per_key == 2 * 1 * 128 * 2


@pytest.mark.parametrize("pool", [Pool(tp=8), Pool(tp=4, pp=2), Pool(tp=8, dpa=True)], ids=str)
def test_timer_equals_step_model(llama70, h100, pool):
    sm = StepModel(llama70, h100, pool)
    timer = StepTimer(sm, 4096, 64)
    for tokens, pairs, keys, sampled in ((1, 900, 900, 1), (64, 64 * 3000, 64 * 3000, 64), (2000, 2e6, 2100, 3)):
        direct = sm.step_seconds(StepShape.of(tokens, pairs, keys, sampled))[0]
        assert timer.seconds(tokens, pairs, keys, sampled) == pytest.approx(direct, rel=1e-12)


def test_decode_is_bound_by_weights_and_cache(llama70, h100):
    sm = StepModel(llama70, h100, Pool(tp=8))
    small = sm.step_seconds(StepShape.of(1, 1000, 1000, 1))[0]
    context = sm.step_seconds(StepShape.of(1, 50_000, 50_000, 1))[0]
    more_context = sm.step_seconds(StepShape.of(1, 100_000, 100_000, 1))[0]
    weights_s = instance_memory(sm, 80).weights / (h100.gpu.hbm_gbps * 1e9 * h100.gpu.efficiency.memory_fraction)
    assert small > weights_s  # at least the weights are streamed once
    extra = (100_000 - 50_000) * 40960 / (h100.gpu.hbm_gbps * 1e9 * h100.gpu.efficiency.memory_fraction)
    assert more_context - context == pytest.approx(extra, rel=0.02)  # plus the extra cache, at HBM speed
