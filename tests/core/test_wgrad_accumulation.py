"""Gradient-accumulation fusion: the weight-gradient GEMM adds into the main gradient in its epilogue, by hand.

Megatron-LM (since commit 83b1e42f, 2022) and Transformer Engine (``fuse_wgrad_accumulation``) run each
linear layer's weight-gradient GEMM with beta = 1 on the main-gradient buffer: every micro-batch its
epilogue reads the buffer and writes it back, 2 x (buffer dtype) bytes an element, where a plain GEMM
writes one BF16 copy (2 bytes). The store follows the GEMM's main loop (the kernel model), so with one
GPU and no pipeline an iteration of m micro-batches gains exactly

    m * layers * (linear weights of a layer) * (2 x grad bytes - 2) / (HBM bandwidth x memory fraction).

For a GPT layer (equal K/V heads, GeLU MLP) the linear weights are 4 h^2 + 2 h ffn. The output layer
and the router stay in BF16 and are not counted (a few percent of their own GEMM).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.frameworks import load_profile
from stageopt.hardware import load_hardware
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for

STACKS = Path(__file__).resolve().parents[2] / "simulators" / "frameworks"
H, FFN, LAYERS, MICROBATCHES = 2048, 8192, 4, 4
MODEL = ("gpt3-175b", [f"layers={LAYERS}", f"hidden={H}", "heads=16", "kv_heads=16", f"ffn={FFN}",
                       "vocab=32000", "seq=2048"])
PLAN = f"tp=1 pp=1 dp=1 mbs=1 gbs={MICROBATCHES} recompute=none dtype={{}}"


def without_fusion(tmp_path: Path, stack: str) -> str:
    path = tmp_path / f"{stack}-unfused.yaml"
    path.write_text(f"base: {stack}\nname: {stack}-unfused\nwgrad_accumulation_fusion: false\n")
    return str(path)


def iteration_s(framework: str, dtype: str, simulator=None) -> float:
    return simulate_plan(MODEL[0], PLAN.format(dtype), None, framework=framework, model_set=MODEL[1],
                         hardware="h100-sxm", simulator=simulator)[1].iteration_time_s


def expected_extra_s(grad_bytes: int) -> float:
    gpu = load_hardware("h100-sxm").gpu
    weights = 4 * H * H + 2 * H * FFN
    bandwidth = gpu.hbm_gbps * 1e9 * gpu.efficiency.memory_fraction
    return MICROBATCHES * LAYERS * weights * (2 * grad_bytes - 2) / bandwidth


@pytest.mark.parametrize("simulator", [None, ReplaySimulator()], ids=["analytical", "replay"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_megatron_core_reads_and_writes_its_bf16_main_gradient(tmp_path, simulator, dtype):
    fused = iteration_s("megatron-core", dtype, simulator)
    plain = iteration_s(without_fusion(tmp_path, "megatron-core"), dtype, simulator)
    assert fused - plain == pytest.approx(expected_extra_s(grad_bytes=2), rel=1e-3)


def test_megatron_lm_2022_accumulates_in_fp32(tmp_path):
    fused = iteration_s("megatron-lm-2022", "bf16")
    plain = iteration_s(without_fusion(tmp_path, "megatron-lm-2022"), "bf16")
    assert fused - plain == pytest.approx(expected_extra_s(grad_bytes=4), rel=1e-3)


def test_which_stacks_fuse():
    assert load_profile("megatron-core").wgrad_store_bytes(2, zero=1) == 4
    assert load_profile("megatron-core").wgrad_store_bytes(2, zero=3) is None  # Megatron-FSDP turns it off
    assert load_profile("megatron-lm-2022").wgrad_store_bytes(4, zero=0) == 8
    for stack in ("megatron-lm-2021", "torchtitan", "megatron-deepspeed"):  # autograd writes the gradient
        assert load_profile(stack).wgrad_store_bytes(4, zero=1) is None


def test_a_search_batch_prices_each_plan_with_its_own_epilogue():
    """Plans scored together (a search) that differ only in ZeRO stage: Megatron-FSDP's plan has no fused
    epilogue, the ZeRO-1 plan has one, exactly as when each is scored alone."""
    hw = load_hardware("h100-sxm")
    plans = [workload_for("llama3-8b", f"tp=1 pp=1 dp=8 mbs=1 gbs=64 zero={z}", 8).plan for z in (1, 3)]
    assert [p.wgrad_store_bytes for p in plans] == [4, None]
    model = workload_for("llama3-8b", "tp=1 pp=1 dp=8 mbs=1 gbs=64", 8).model
    together = evaluate_plans(model, hw, plans)["iteration_time_s"]
    for plan, time_s in zip(plans, together):
        assert time_s == pytest.approx(evaluate_plans(model, hw, [plan])["iteration_time_s"][0], rel=1e-12)
