"""The softmax inside flash attention: one exponential per computed score on the special-function units.

Checked by hand through the analytical model: a one-layer model at sequence s with H query heads, its
causal mask cut into n = s / T blocks of T = 128 a side, computes the n (n + 1) / 2 blocks on and below the
diagonal, H (s^2 / 2 + s T / 2) scores forward, and the backward recomputes each once, so pricing the
exponentials adds exactly H (s^2 + s T) / exp_tops seconds per micro-batch, whatever the head dims (MHA /
GQA or MLA's 192 + 128), where the kernel waits for them. A Hopper or Blackwell kernel runs them under its
matmuls (``exp_overlap``): it takes the longer of the two.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stageopt.hardware import load_hardware
from stageopt.hardware.kernels import KERNEL_CODES, Kernels, kernel_seconds
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload


def _compute_s(model_name: str, sets: list[str], exp_tops: float | None, simulator=AnalyticalSimulator) -> float:
    model = load_model(model_name, sets)
    plan = Plan.parse("tp=1 pp=1 dp=1 mbs=1 gbs=1 zero=0")
    hw = load_hardware("h100-sxm")  # exponentials waited for (exp_overlap 0): each one counts
    eff = dataclasses.replace(hw.gpu.efficiency, exp_overlap=0.0)
    hw = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, exp_tops=exp_tops, efficiency=eff))
    return simulator().evaluate(build_workload(model, plan, 1), hw).time_breakdown_s["compute"]


@pytest.mark.parametrize("model_name, sets, heads", [
    ("llama3-8b", ["layers=1", "seq=4096"], 32),
    ("deepseek-v3", ["layers=1", "seq=2048", "dense_layers=0"], 128),
])
def test_each_score_pays_one_exponential_forward_and_one_in_backward(model_name, sets, heads) -> None:
    seq = int(sets[1].split("=")[1])
    added = _compute_s(model_name, sets, 3.87) - _compute_s(model_name, sets, None)
    tile = load_hardware("h100-sxm").gpu.efficiency.attention_tile
    assert tile == 128
    blocks = (seq // tile) * (seq // tile + 1) // 2
    assert added == pytest.approx(2 * heads * blocks * tile**2 / 3.87e12, rel=1e-9)


def test_the_replay_prices_the_exponentials_as_the_analytical_model_does() -> None:
    sets = ["layers=1", "seq=4096"]
    added = [_compute_s("llama3-8b", sets, 3.87, sim) - _compute_s("llama3-8b", sets, None, sim)
             for sim in (AnalyticalSimulator, ReplaySimulator)]
    assert added[1] == pytest.approx(added[0], rel=1e-9)


def test_a_sliding_window_pays_the_blocks_both_of_its_edges_cut() -> None:
    """Window 1,024 over 8,192 positions in 128-wide blocks: query block b computes key blocks max(0, b - 8)
    to b, 540 blocks in all (36 while the window fills, then 56 x 9) against 491.5 blocks of scores it keeps.
    The model's edge term, 1 + T / (2 x keys kept per edge), lands within 1% of that count."""
    sets = ["layers=1", "seq=8192", "layer_pattern=L", "sliding_window=1024"]
    added = _compute_s("llama3-8b", sets, 3.87) - _compute_s("llama3-8b", sets, None)
    assert added == pytest.approx(2 * 32 * 540 * 128**2 / 3.87e12, rel=0.01)


@pytest.mark.parametrize("exp_tops", [3.87, 0.5])
def test_an_overlapping_kernel_takes_the_longer_of_its_matmuls_and_its_exponentials(exp_tops) -> None:
    """One non-causal forward kernel of 1e12 FLOPs at head dim 128 (512 FLOPs a score): matmuls at the
    preset's share of 989.4 TFLOP/s, 1e12 / 512 exponentials at ``exp_tops``. H100's best kernel hides the
    shorter under the longer (3.87: exponentials shorter; 0.5: longer); FlashAttention-2 pays both."""
    hw = load_hardware("h100-sxm")
    hw = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, exp_tops=exp_tops))
    eff = hw.gpu.efficiency
    one, zero = np.ones(1), np.zeros(1)
    kern = Kernels(code=np.array([KERNEL_CODES["attention"]]), flops=1e12 * one, nbytes=zero, m=zero, n=zero,
                   k=512 * one, batch=one, precision=zero, backward=np.zeros(1, dtype=bool))
    launch = eff.launch_us * 1e-6
    exps = 1e12 / 512 / (exp_tops * 1e12)
    best = launch + max(1e12 / (eff.attention_forward.peak_fraction * 989.4e12), exps)
    fa2 = launch + 1e12 / (eff.attention_forward.fa2_peak_fraction * 989.4e12) + exps
    assert eff.exp_overlap == 1.0
    assert kernel_seconds(hw, "bf16", kern)[0] == pytest.approx(best, rel=1e-9)
    assert kernel_seconds(hw, "bf16", kern, attention_kernel="fa2")[0] == pytest.approx(fa2, rel=1e-9)
