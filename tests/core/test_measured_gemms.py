"""The GEMM shape model against GEMMs timed on a real H200 (experiments/kernels/h200/gemm.csv).

The measurements are independent of the model: cuBLAS through PyTorch on 441
BF16 shapes (every linear layer of four dense models at tp 1-8, forward and both
gradients, plus sweeps over n, m and k), each after a warm-up load and scaled to
one SM clock. An isolated GEMM pins down two parameters (its share of peak and
the fixed cost per kernel), so both are fitted; what is checked is the shape
curve that remains: the tile cuBLAS picks, whole waves, and the output store.
"""

from __future__ import annotations

import csv
import dataclasses
import pathlib

import numpy as np
import pytest
from scipy.optimize import least_squares

from stageopt.hardware import load_hardware
from stageopt.hardware.efficiency import MatmulEfficiency, gemm_padded_flops, gemm_tiled_flops
from stageopt.hardware.kernels import HIGH, Kernels, kernel_seconds

MEASURED = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "kernels" / "h200" / "gemm.csv"


def test_a_128_column_gemm_takes_the_transposed_tile_not_half_empty_ones():
    """m=8192, n=128, k=4096 on 132 SMs, by hand: 256x128 tiles: 32 tiles, split-K 4 ways (floor(132/32)),
    one wave of 132 x 1024 k-steps; 128x128 tiles: 64, split 2 ways, 132 x 2048 steps at 0.93 of the rate;
    128x256 tiles: 64 half-empty tiles, 132 x 2048 steps of twice the work."""
    matmul = MatmulEfficiency(peak_fraction=0.7)
    transposed = 2 * 256 * 128 * 132 * 1024
    assert gemm_padded_flops(8192, 128, 4096, 1, 256, 128, 132) == transposed
    assert gemm_padded_flops(8192, 128, 4096, 1, 128, 128, 132) / 0.93 > transposed
    assert gemm_padded_flops(8192, 128, 4096, 1, 128, 256, 132) == 2 * transposed
    assert gemm_tiled_flops(8192, 128, 4096, 1, matmul, 132) == transposed


def _measured():
    if not MEASURED.exists():
        pytest.skip("experiments/kernels/h200/gemm.csv not in this checkout")
    with open(MEASURED) as handle:
        rows = [r for r in csv.DictReader(handle) if r["dtype"] == "bf16" and float(r["seconds"]) > 40e-6]
    clock = np.median([float(r["sm_mhz"]) for r in rows])
    seconds = np.array([float(r["seconds"]) * float(r["sm_mhz"]) / clock for r in rows])
    m, n, k = (np.array([float(r[f]) for r in rows]) for f in "mnk")
    size = len(rows)
    kern = Kernels(code=np.zeros(size, int), flops=2 * m * n * k, nbytes=2 * (m * k + n * k + m * n), m=m, n=n, k=k,
                   batch=np.ones(size), precision=np.full(size, HIGH), backward=np.zeros(size, bool))
    return kern, seconds


def _fitted_errors(model) -> np.ndarray:
    kern, seconds = _measured()
    fit = least_squares(lambda p: np.log(model(kern, *p) / seconds), [0.6, 5.0], bounds=([0.3, 0.0], [1.0, 30.0]))
    return model(kern, *fit.x) / seconds - 1


def _stageopt(kern, share, launch_us):
    hw = load_hardware("h200-sxm")
    eff = hw.gpu.efficiency
    eff = dataclasses.replace(eff, matmul=dataclasses.replace(eff.matmul, peak_fraction=share), launch_us=launch_us,
                              host_us=0.0)
    return kernel_seconds(dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, efficiency=eff)), "bf16", kern)


def _one_tile_no_store(kern, share, launch_us):
    gpu = load_hardware("h200-sxm").gpu
    padded = gemm_padded_flops(kern.m, kern.n, kern.k, 1, 128, 256, gpu.sm_count)
    return launch_us * 1e-6 + np.maximum(padded / (share * gpu.peak("bf16") * 1e12),
                                         kern.nbytes / (gpu.hbm_gbps * 1e9 * gpu.efficiency.memory_fraction))


def test_the_shape_model_prices_measured_h200_gemms_within_a_few_percent():
    errors = _fitted_errors(_stageopt)
    assert np.mean(np.abs(errors)) < 0.035
    assert np.max(np.abs(errors)) < 0.16


def test_tile_choice_and_output_store_cut_the_error_of_one_fixed_tile():
    ours, old = _fitted_errors(_stageopt), _fitted_errors(_one_tile_no_store)
    assert np.mean(np.abs(ours)) < 0.75 * np.mean(np.abs(old))
    assert np.max(np.abs(ours)) < 0.3 * np.max(np.abs(old))  # the one-tile model is 68% off a 128-column GEMM
