"""Routed experts' GEMMs as Transformer Engine runs them: one cuBLAS GEMM per local expert, four streams.

Megatron-Core's TEGroupedMLP runs its experts through TE's GroupedLinear, whose grouped GEMM launches one
GEMM per expert round-robin over 4 compute streams (multi_stream_cublas_gemm): the launches' fixed costs
overlap four at a time, and the loop over them is one call from Python. A stack with one grouped kernel
(torch._grouped_mm, CUTLASS) pays one launch. Checked by hand: a layer of gpt-oss-120b on 8 expert-parallel
ranks has 16 local experts, so each of its 6 expert GEMM kernels (forward fc1 and fc2, their data and weight
gradients) pays ceil(16 / 4) = 4 launches where the grouped stack pays 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stageopt.hardware.kernels import GEMM_STREAMS, Kernels, kernel_seconds
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import hardware_for, workload_for

PLAN = "tp=1 pp=1 dp=8 ep=8 mbs=1 gbs=8 recompute=none"
LOCAL = 128 // 8  # gpt-oss-120b's experts over 8 expert-parallel ranks
SMALL = ["layers=2", "seq=256"]


def _grouped_profile(tmp_path) -> str:
    path = tmp_path / "grouped.yaml"
    path.write_text("base: megatron-core\nname: megatron-core-grouped\ndescription: one grouped expert kernel\n"
                    "source: test\nexpert_gemms: grouped\n")
    return str(path)


def _gemm(count: int, flops: float = 1e6) -> Kernels:
    one = np.ones(1)
    return Kernels(code=np.zeros(1, dtype=int), flops=flops * one, nbytes=1e3 * one, m=64 * one, n=64 * one,
                   k=128 * one, batch=LOCAL * one, precision=np.zeros(1, dtype=int), backward=np.zeros(1, bool),
                   count=count)


def test_a_gemm_of_sixteen_kernels_pays_four_rounds_of_launches_and_one_dispatch():
    hw = hardware_for("h100-sxm")
    launch = hw.gpu.efficiency.launch_us * 1e-6
    extra = kernel_seconds(hw, "bf16", _gemm(LOCAL))[0] - kernel_seconds(hw, "bf16", _gemm(1))[0]
    assert GEMM_STREAMS == 4 and extra == pytest.approx((math.ceil(LOCAL / 4) - 1) * launch)
    slow_host = hardware_for("h100-sxm", ["gpu.efficiency.host_us=50"])
    assert kernel_seconds(slow_host, "bf16", _gemm(LOCAL))[0] == pytest.approx(50e-6)  # one Python call


def test_megatron_core_launches_a_gemm_per_local_expert_and_a_grouped_stack_one(tmp_path):
    for framework, launches in (("megatron-core", LOCAL), (_grouped_profile(tmp_path), 1)):
        work = workload_for("gpt-oss-120b", PLAN, 8, framework=framework, model_set=SMALL)
        gemms = [n for n in build_stage_program(work, 0).nodes
                 if n.kernel == "matmul" and "expert" in n.name and n.gemm[3] == LOCAL]
        assert {n.phase for n in gemms} == {"fwd", "bwd"}
        assert {n.launches for n in gemms} == {launches}


def test_both_backends_charge_three_more_launches_per_expert_gemm_kernel(tmp_path):
    hw = hardware_for("h100-sxm")
    launch = hw.gpu.efficiency.launch_us * 1e-6
    per_layer = 6 * (math.ceil(LOCAL / GEMM_STREAMS) - 1) * launch  # fc1 (gate and up fused) and fc2, 3 passes
    times = {}
    for name, framework in (("each", "megatron-core"), ("grouped", _grouped_profile(tmp_path))):
        work = workload_for("gpt-oss-120b", PLAN, 8, framework=framework, model_set=SMALL)
        times[name] = (AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["compute"],
                       ReplaySimulator().evaluate(work, hw).iteration_time_s)
    for backend in range(2):
        assert times["each"][backend] - times["grouped"][backend] == pytest.approx(2 * per_layer, rel=1e-6)
