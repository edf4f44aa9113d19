"""The calibration's parameter ranges: physical, for Hopper capped by the kernels timed alone, for A100 by
FlashAttention-2's published forward share."""

from __future__ import annotations

import importlib.util
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from stageopt.hardware import load_hardware
from stageopt.validation.calibrate import MEASURED_CEILINGS, PARAMETERS, fitted_ranges

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "kernels"


def _rows(hardware: str, dtype: str) -> list:
    """Stand-ins for prepared rows: the range only reads a row's hardware preset and dtype."""
    plan = SimpleNamespace(dtype=dtype)
    return [SimpleNamespace(run=SimpleNamespace(hardware=hardware), work=SimpleNamespace(plan=plan))]


def test_hopper_rows_cannot_fit_shares_above_what_their_kernels_reach_alone():
    hopper = {key: high for key, _, high in fitted_ranges(_rows("h100-sxm", "fp8"))}
    for key, ceiling in MEASURED_CEILINGS["hopper"].items():
        assert hopper[key] == ceiling
    a100 = {key: high for key, _, high in fitted_ranges(_rows("a100-80g", "bf16"))}
    physical = {key: high for key, _, high in PARAMETERS if "fp8" not in key}
    assert a100 == {**physical, "gpu.efficiency.attention_forward.peak_fraction": 0.73}  # FA2's 73% (Dao 2023)
    assert load_hardware("a100-80g").gpu.efficiency.attention_forward.peak_fraction <= 0.73
    eff = load_hardware("h100-sxm").gpu.efficiency  # the shipped fit sits under the ceilings
    assert eff.matmul.peak_fraction <= hopper["gpu.efficiency.matmul.peak_fraction"]
    assert eff.matmul.fp8_peak_fraction <= hopper["gpu.efficiency.matmul.fp8_peak_fraction"]
    assert eff.attention_forward.peak_fraction <= hopper["gpu.efficiency.attention_forward.peak_fraction"]


def _compare_kernels(needed: str):
    """experiments/kernels/compare_kernels.py as a module (skip where a user's clone lacks the measurements)."""
    if not (KERNELS / "h100" / needed).exists():
        pytest.skip("experiments/kernels not in this checkout")
    spec = importlib.util.spec_from_file_location("compare_kernels", KERNELS / "compare_kernels.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    return kernels


def test_the_ceilings_are_what_the_committed_measurements_give():
    kernels = _compare_kernels("gemm.csv")
    shares = {"bf16": [], "fp8": [], "attention": []}
    for gpu in ("h100", "h200"):
        hw, folder = load_hardware(f"{gpu}-sxm"), KERNELS / gpu
        gemms = kernels.read(folder, "gemm")
        clock = float(np.median([float(r["sm_mhz"]) for r in gemms]))
        for dtype in ("bf16", "fp8"):
            shares[dtype].append(kernels.gemm_fit(hw, gemms, dtype, clock)[0])
        attention = kernels.attention_shares(hw, kernels.read(folder, "attention"), clock)
        shares["attention"].append(np.mean([v[0] for v in attention["cudnn", "fwd"]]))
    ceilings = MEASURED_CEILINGS["hopper"]
    assert max(shares["bf16"]) == pytest.approx(ceilings["gpu.efficiency.matmul.peak_fraction"], abs=0.001)
    assert max(shares["fp8"]) == pytest.approx(ceilings["gpu.efficiency.matmul.fp8_peak_fraction"], abs=0.001)
    assert max(shares["attention"]) == pytest.approx(ceilings["gpu.efficiency.attention_forward.peak_fraction"],
                                                     abs=0.001)


def test_flash_attention_2_shares_are_the_measured_ones():
    """The presets' FlashAttention-2 shares are what the committed attention timings give (at the clock each
    kernel ran, the exponentials priced apart), not a fit: the torchtitan rows cannot move them."""
    kernels = _compare_kernels("attention.csv")
    for gpu in ("h100", "h200"):
        hw = load_hardware(f"{gpu}-sxm")
        measured = kernels.attention_shares(hw, kernels.read(KERNELS / gpu, "attention"), 1.0)
        eff = hw.gpu.efficiency
        for phase, kernel in (("fwd", eff.attention_forward), ("bwd", eff.attention_backward)):
            assert kernel.fa2_peak_fraction == pytest.approx(np.mean([v[0] for v in measured["flash2", phase]]),
                                                             abs=0.001)
    teton = load_hardware("h100-grand-teton").gpu.efficiency
    assert teton.attention_forward.fa2_peak_fraction == load_hardware("h100-sxm").gpu.efficiency \
        .attention_forward.fa2_peak_fraction


def test_hoppers_backward_to_forward_tie_is_what_its_cudnn_kernel_reaches_alone():
    """The tie between Hopper's fitted backward and forward attention shares is the ratio the cuDNN kernel's
    timings give on an H100 and an H200 (each at the clock it ran), within their spread."""
    from stageopt.validation.calibrate import MEASURED_BACKWARD_TO_FORWARD
    kernels = _compare_kernels("attention.csv")
    ratios = []
    for gpu in ("h100", "h200"):
        hw = load_hardware(f"{gpu}-sxm")
        shares = kernels.attention_shares(hw, kernels.read(KERNELS / gpu, "attention"), 1.0)
        forward, backward = (np.mean([v[0] for v in shares["cudnn", way]]) for way in ("fwd", "bwd"))
        ratios.append(backward / forward)
    assert min(ratios) - 0.01 <= MEASURED_BACKWARD_TO_FORWARD["hopper"] <= max(ratios) + 0.01
    assert MEASURED_BACKWARD_TO_FORWARD["hopper"] == pytest.approx(np.mean(ratios), abs=0.01)
