"""NVFP4 training (Transformer Engine's block-scaled FP4 recipe), each figure derived by hand.

NVFP4 holds an element in 4 bits plus one E4M3 scale per 16 elements: 9/16 of a byte.
Its linear-layer GEMMs run at the FP4 peak (B200: 9,000 TFLOP/s dense, twice FP8's 4,500).
"""

import dataclasses

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block, saved_bytes_key
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import load_hardware
from stageopt.hardware.kernels import HIGH, LOWP, LOWP_CAST, Kernels, kernel_seconds
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.run import simulate_plan

NVFP4_BYTES = 9 / 16


def test_a_large_nvfp4_gemm_takes_half_the_fp8_time_on_b200():
    gpu = load_hardware("b200").gpu
    m = n = k = 16384  # whole tiles and waves: compute-bound in both formats
    store = m * n * 2 / (gpu.hbm_gbps * 1e9 * gpu.efficiency.memory_fraction)  # both write a BF16 output
    fixed = gpu.efficiency.launch_us * 1e-6 + store
    fp8, fp4 = (gpu.matmul_time_s(m, n, k, dtype) - fixed for dtype in ("fp8", "nvfp4"))
    assert gpu.peak("nvfp4") == 2 * gpu.peak("fp8") == 9000
    assert fp4 / fp8 == pytest.approx(0.5, rel=1e-9)


def test_an_fp4_share_of_peak_overrides_the_fp8_share():
    hw = load_hardware("b200")
    matmul = dataclasses.replace(hw.gpu.efficiency.matmul, fp4_peak_fraction=0.35)
    gpu = dataclasses.replace(hw.gpu, efficiency=dataclasses.replace(hw.gpu.efficiency, matmul=matmul))
    m = n = k = 16384
    # 128 x 64 = 8,192 tiles of 128 x 256 over 148 SMs: 55 full waves, then 52 tiles split in two along k
    # (55.5 waves; the 128 x 128 tile needs 111 waves of half the work at 0.93 of the rate: dearer)
    assert gpu.sm_count == 148
    padded = 2 * 128 * 256 * (55 * 148 * k + 148 * k // 2)
    store = m * n * 2 / (gpu.hbm_gbps * 1e9 * gpu.efficiency.memory_fraction)  # the BF16 output, after the main loop
    expected = gpu.efficiency.launch_us * 1e-6 + padded / (0.35 * 9000e12) + store
    assert gpu.matmul_time_s(m, n, k, "nvfp4") == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("dtype, cast_bytes", [("fp8", 2 + 2 * 1), ("nvfp4", 2 + 2 * NVFP4_BYTES)])
def test_the_cast_before_a_low_precision_gemm_moves_bf16_in_and_two_quantized_copies_out(dtype, cast_bytes):
    hw = load_hardware("b200")
    eff = hw.gpu.efficiency
    m, k = 65536, 8192

    def seconds(precision):
        kern = Kernels(code=0, flops=2.0 * m * 8 * k, nbytes=0.0, m=m, n=8, k=k, batch=1, precision=precision,
                       backward=False)
        return float(kernel_seconds(hw, dtype, kern))

    bandwidth = hw.gpu.hbm_gbps * 1e9 * eff.memory_fraction
    cast = seconds(LOWP_CAST) - seconds(LOWP)
    assert cast == pytest.approx(eff.launch_us * 1e-6 + cast_bytes * m * k / bandwidth, rel=1e-9)
    assert seconds(HIGH) > seconds(LOWP)  # the same GEMM in BF16 is slower


def test_a_llama_layer_saves_its_gemm_inputs_as_nvfp4_copies():
    # FP8 keeps one-byte copies of ln1, ln2, the SwiGLU output and the attention output
    # (tests/core/test_fp8_activation_memory.py): per token 3h + ffn elements. NVFP4 keeps the same
    # copies at 9/16 of a byte.
    model = load_model("llama3-70b")
    plan = Plan.parse("tp=1 mbs=1 dtype=nvfp4", framework=load_profile("megatron-core"))
    values = compile_block("dense", arch_of(model, plan), plan.recompute).evaluate(symbol_values(model, plan))
    copies = model.seq * (3 * model.hidden + model.ffn)
    assert saved_bytes_key(plan) == "saved_bytes_nvfp4"
    assert float(values["saved_bytes_nvfp4"]) == pytest.approx(
        float(values["saved_bytes_fp8"]) - (1 - NVFP4_BYTES) * copies, rel=1e-9)


def test_weights_are_held_and_gathered_in_nvfp4():
    plan = "tp=1 pp=1 dp=1 mbs=1 gbs=1 zero=0 recompute=full"
    _, bf16 = simulate_plan("llama3-8b", f"{plan} dtype=bf16", 1, hardware="b200")
    _, fp4 = simulate_plan("llama3-8b", f"{plan} dtype=nvfp4", 1, hardware="b200")
    ratio = fp4.memory_breakdown_gib["weights"] / bf16.memory_breakdown_gib["weights"]
    assert ratio == pytest.approx(NVFP4_BYTES / 2, rel=1e-9)
    assert fp4.iteration_time_s < bf16.iteration_time_s


def test_nvfp4_needs_fp4_tensor_cores_and_a_stack_with_the_recipe(tmp_path):
    from stageopt.cli import main

    args = ["simulate", "--model", "llama3-8b", "--gpus", "8", "--plan", "tp=8 mbs=1 gbs=8 dtype=nvfp4"]
    assert main([*args, "--hardware", "h100-sxm"]) == 2  # no FP4 tensor cores on Hopper
    assert main([*args, "--hardware", "b200"]) == 0
    with pytest.raises(InfeasiblePlan, match="dtype=nvfp4 has no recipe in framework torchtitan"):
        simulate_plan("llama3-8b", "tp=8 mbs=1 gbs=8 dtype=nvfp4", 8, hardware="b200", framework="torchtitan")
    with pytest.raises(InfeasiblePlan, match="grad_dtype"):
        Plan.parse("dtype=nvfp4 grad_dtype=nvfp4")
