"""Dropout draws a random number per element: its kernels stream at ``random_fraction`` of the copy rate.

PyTorch's dropout reaches 0.80 of a copy's bandwidth on H100 and 0.65 on H200 (experiments/kernels/):
the Philox generator costs SM work a copy does not. The graph marks every forward op that draws
(dropout, alone or fused into bias-dropout-add, and its recomputed copy) as ``vector_random``; the
gradient that applies the saved mask draws nothing. The kernel model's time is checked by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of, build_block
from stageopt.graph.compile import kernel_name
from stageopt.hardware.kernels import KERNEL_CODES, Kernels, kernel_seconds
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.run import hardware_for

SMALL = ["layers=2", "hidden=256", "heads=4", "kv_heads=4", "ffn=1024", "vocab=1024", "seq=128", "dropout=true"]


def _block(recompute: str = "none"):
    stack = load_profile("megatron-lm-2021")  # eager attention, fused bias-dropout-add
    plan = Plan.parse(f"tp=1 mbs=1 gbs=1 recompute={recompute}", gpus=None, framework=stack)
    return build_block("dense", arch_of(load_model("gpt3-175b", SMALL), plan), plan.recompute)


def test_dropout_draws_forward_and_in_recompute_but_not_in_its_gradient():
    block = _block("full")
    drawn = {op.name for op in block.fwd if kernel_name(op) == "vector_random"}
    assert "attn_dropout" in drawn  # alone, after the softmax
    assert any("proj_dropout" in name and "+" in name for name in drawn)  # fused into bias-dropout-add
    assert {op.name for op in block.recompute if kernel_name(op) == "vector_random"} == drawn
    assert not [op.name for op in block.bwd if kernel_name(op) == "vector_random"]
    assert all(kernel_name(op) == "vector" for op in block.fwd if op.kind == "vector" and "dropout" not in op.name)


@pytest.mark.parametrize("hardware, fraction", [("h100-sxm", 0.80), ("h200-sxm", 0.65), ("a100-80g", 0.60)])
def test_a_drawing_kernel_streams_at_its_share_of_the_copy_rate(hardware, fraction):
    """2.5 GiB (bf16 in and out, a 1-byte mask) at memory_fraction x random_fraction of HBM, plus one launch."""
    hw = hardware_for(hardware, ["gpu.efficiency.host_us=0"])
    eff = hw.gpu.efficiency
    nbytes = 2.5 * 2**30

    def seconds(code: str) -> float:
        kern = Kernels(code=np.array([KERNEL_CODES[code]]), flops=np.array([0.0]), nbytes=np.array([nbytes]),
                       m=np.zeros(1), n=np.zeros(1), k=np.zeros(1), batch=np.zeros(1),
                       precision=np.array([0]), backward=np.array([False]))
        return float(kernel_seconds(hw, "bf16", kern)[0])

    copy_rate = hw.gpu.hbm_gbps * 1e9 * eff.memory_fraction
    assert eff.random_fraction == fraction
    assert seconds("vector") == pytest.approx(eff.launch_us * 1e-6 + nbytes / copy_rate, rel=1e-9)
    assert seconds("vector_random") == pytest.approx(eff.launch_us * 1e-6 + nbytes / (copy_rate * fraction), rel=1e-9)
