"""A step runs at the pace of its slowest GPU (gpu.efficiency.speed_spread, Sinha et al. SC22).

The expected slowdown of the slowest of n GPUs is checked against the expected maximum of n standard
normals integrated numerically; a kernel's GEMM and attention time against the closed form with the
peak divided by that slowdown, HBM-bound kernels unchanged; and the analytical model and the replay
against each other: both charge the same factor on the same kernels, so the step's compute grows alike.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import norm

from stageopt.cli import main
from stageopt.hardware.kernels import KERNEL_CODES, Kernels, kernel_seconds
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload


def _expected_max_of_normals(n: int) -> float:
    x = np.linspace(-12, 12, 240001)
    return float(np.trapezoid(x * n * norm.pdf(x) * norm.cdf(x) ** (n - 1), x))


@pytest.mark.parametrize("n", [8, 64, 512, 4096, 16384])
def test_slowdown_is_the_spread_times_the_expected_maximum(n):
    eff = hardware_for("h100-sxm", ["gpu.efficiency.speed_spread=0.02"]).gpu.efficiency
    assert (eff.slowest_gpu_slowdown(n) - 1) / 0.02 == pytest.approx(_expected_max_of_normals(n), rel=0.01)
    assert eff.slowest_gpu_slowdown(1) == 1.0


def _one(code: str, gpus: int, **shape) -> float:
    hw = hardware_for("h100-sxm", ["gpu.efficiency.speed_spread=0.02", "gpu.efficiency.host_us=0"])
    m, n, k = shape.get("m", 0), shape.get("n", 0), shape.get("k", 0)
    flops = 2.0 * m * n * k if code == "matmul" else 0.0
    nbytes = shape.get("nbytes", 2.0 * (m * k + k * n + m * n))
    kern = Kernels(code=np.array([KERNEL_CODES[code]]), flops=np.array([flops]), nbytes=np.array([nbytes]),
                   m=np.array([m]), n=np.array([n]), k=np.array([k]), batch=np.array([1 if m else 0]),
                   precision=np.array([0]), backward=np.array([False]), gpus=gpus)
    return float(kernel_seconds(hw, "bf16", kern)[0])


def test_a_gemm_main_loop_runs_at_the_slowest_clock_and_a_stream_does_not():
    """A 16896 x 256 x 16384 BF16 GEMM is one whole wave of 132 128x256 tiles, so its main loop is its
    FLOPs at the GEMM share of peak; launch and store stay as they are. The slowdown multiplies only the
    main loop."""
    hw = hardware_for("h100-sxm")
    eff, gpu = hw.gpu.efficiency, hw.gpu
    shape = {"m": 16896, "n": 256, "k": 16384}
    main_loop = 2 * 16896 * 256 * 16384 / (eff.matmul.peak_fraction * gpu.sustained_peak("bf16") * 1e12)
    slow = 1 + 0.02 * float(norm.ppf((1024 - 0.375) / (1024 + 0.25)))
    alone, lockstep = _one("matmul", 1, **shape), _one("matmul", 1024, **shape)
    assert lockstep - alone == pytest.approx(main_loop * (slow - 1), rel=0.01)
    stream = _one("vector", 1, nbytes=4e9)
    assert _one("vector", 1024, nbytes=4e9) == stream
    assert stream == pytest.approx(eff.launch_us * 1e-6 + 4e9 / (gpu.hbm_gbps * 1e9 * eff.memory_fraction))


def _compute_seconds(spread: float, simulator) -> float:
    work = build_workload(load_model("llama3-8b", ["layers=4"]), Plan.parse("tp=2 pp=1 dp=32 mbs=1 gbs=32"), 64)
    est = simulator.evaluate(work, hardware_for("h100-sxm", [f"gpu.efficiency.speed_spread={spread}"]))
    return est.iteration_time_s


def test_both_backends_slow_the_step_alike():
    grown = {}
    for sim in (AnalyticalSimulator(), ReplaySimulator()):
        grown[type(sim).__name__] = _compute_seconds(0.03, sim) / _compute_seconds(0.0, sim)
    assert grown["AnalyticalSimulator"] > 1.05  # 64 GPUs: 1 + 0.03 x 2.34 on the GEMMs and attention
    assert grown["ReplaySimulator"] == pytest.approx(grown["AnalyticalSimulator"], rel=0.01)


def test_simulate_reports_the_pace_it_charged(capsys):
    """`stageopt simulate --json` says by how much the slowest of the plan's 256 GPUs stretches the GEMMs
    (Blom's approximation: within 1% of the expected maximum, so 3e-4 of the factor)."""
    assert main(["simulate", "--model", "llama3-8b", "--plan", "tp=2 pp=1 dp=128 mbs=1 gbs=128", "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)["slowest_gpu_slowdown"]
    assert reported == pytest.approx(1 + 0.01 * _expected_max_of_normals(256), rel=5e-4)
