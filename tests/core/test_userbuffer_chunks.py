"""Userbuffer TP overlap runs the GEMMs it pipelines in chunks; each chunk is a smaller GEMM the kernel model prices.

By hand, for one Llama layer at tp=2 (Transformer Engine's default methods, ``module/base.py``): the forward
QKV and FC1 GEMMs run as tp = 2 GEMMs of half the tokens (ring-exchange all-gather), the forward output
projection and FC2 as 4 (the ``pipeline`` reduce-scatter's ``num_splits``), the backward data gradients of the
output projection and FC2 as 2; weight gradients and the rest stay whole. The chunks go to Transformer Engine's
3 userbuffer compute streams, so their fixed costs (launches) overlap three at a time: 2 chunks pay one, 4 pay two
(``_NUM_MAX_UB_STREAMS``, ``cpp_extensions/gemm.py``). The compute the plan gains from
``tp_overlap=on`` is the sum of those chunked GEMMs minus the whole ones, in both backends.
"""

from __future__ import annotations

import numpy as np
import pytest

from stageopt.hardware import load_hardware
from stageopt.hardware.kernels import HIGH, Kernels, kernel_seconds
from stageopt.sim.run import simulate_plan

TOKENS, HIDDEN, FFN, HEADS, KV, HEAD_DIM, TP = 2048, 4096, 14336, 32, 8, 128, 2
MODEL_SET = ["layers=2", f"seq={TOKENS}"]
PLAN = "tp=2 pp=1 dp=1 mbs=1 gbs=1 recompute=none dtype=bf16 sp=on"


def _gemm(hw, m, n, k, chunks=1):
    m = m / chunks
    kern = Kernels(code=np.array([0]), flops=np.array([2.0 * m * n * k]), nbytes=np.array([2.0 * (m * k + n * k + m * n)]),
                   m=np.array([m]), n=np.array([n]), k=np.array([k]), batch=np.array([1.0]),
                   precision=np.array([HIGH]), backward=np.array([False]))
    # the chunks run on 3 streams: one fixed cost per three chunks, not one per chunk
    rounds = -(-chunks // 3)
    return chunks * float(kernel_seconds(hw, "bf16", kern)[0]) - (chunks - rounds) * hw.gpu.efficiency.launch_us * 1e-6


def _expected_extra_per_layer(hw):
    qkv = (TOKENS, (HEADS + 2 * KV) * HEAD_DIM // TP, HIDDEN)
    fc1 = (TOKENS, 2 * FFN // TP, HIDDEN)
    proj = (TOKENS, HIDDEN, HEADS * HEAD_DIM // TP)
    fc2 = (TOKENS, HIDDEN, FFN // TP)
    proj_dgrad = (TOKENS, HEADS * HEAD_DIM // TP, HIDDEN)
    fc2_dgrad = (TOKENS, FFN // TP, HIDDEN)
    split = [(qkv, TP), (fc1, TP), (proj, 4), (fc2, 4), (proj_dgrad, TP), (fc2_dgrad, TP)]
    return sum(_gemm(hw, *shape, chunks) - _gemm(hw, *shape) for shape, chunks in split)


@pytest.mark.parametrize("backend", ["analytical", "replay"])
def test_chunked_gemms_add_what_the_kernel_model_prices_for_the_smaller_gemms(backend):
    hw = load_hardware("h100-sxm")
    times = {}
    for overlap in ("on", "off"):
        simulator = None
        if backend == "replay":
            from stageopt.sim.replay import ReplaySimulator
            simulator = ReplaySimulator()
        _, est = simulate_plan("llama3-8b", f"{PLAN} tp_overlap={overlap}", None, model_set=MODEL_SET,
                               simulator=simulator)
        times[overlap] = est.time_breakdown_s["compute"]
    expected = 2 * _expected_extra_per_layer(hw)  # two layers, one micro-batch
    assert expected > 0
    assert times["on"] - times["off"] == pytest.approx(expected, rel=0.02)
