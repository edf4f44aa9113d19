"""FlashAttention-2 is priced at its own measured share of peak, by hand; not tied to the best kernel's fit.

One causal attention forward kernel of F model FLOPs and S scores costs, at a share f of the dense peak P,

    launch + (F / 2) / (f P) + S / (exponential rate),

where a causal kernel executes half its model FLOPs. With ``fa2`` the share is the GPU's
``attention_forward.fa2_peak_fraction`` where set, else ``fa2_attention_scale`` times the best share.
The best kernel on Hopper and Blackwell runs its exponentials under its matmuls (``exp_overlap`` 1):
it costs the longer of the two, not their sum.
"""

from __future__ import annotations

import numpy as np
import pytest

from stageopt.hardware import apply_hw_overrides, load_hardware
from stageopt.hardware.kernels import HIGH, KERNEL_CODES, Kernels, kernel_seconds

B, H, S, D = 1, 32, 8192, 128
FLOPS = 4.0 * B * H * S * S * D  # model FLOPs of one attention forward (QK^T and PV)


def forward_s(hw, kernel: str) -> float:
    kern = Kernels(code=np.array([KERNEL_CODES["attention_causal"]]), flops=np.array([FLOPS]),
                   nbytes=np.zeros(1), m=np.zeros(1), n=np.zeros(1), k=np.array([4.0 * D]),
                   batch=np.zeros(1), precision=np.array([HIGH]), backward=np.zeros(1, dtype=bool))
    return float(kernel_seconds(hw, "bf16", kern, kernel)[0])


def by_hand(hw, share: float, overlapped: bool = False) -> float:
    gpu = hw.gpu
    mma, exps = FLOPS / 2 / (share * gpu.peak("bf16") * 1e12), FLOPS / 2 / (4.0 * D) / (gpu.exp_tops * 1e12)
    return gpu.efficiency.launch_us * 1e-6 + (max(mma, exps) if overlapped else mma + exps)


def test_fa2_runs_at_its_measured_share_whatever_the_best_kernel_is():
    hw = load_hardware("h100-sxm")
    fa2 = hw.gpu.efficiency.attention_forward.fa2_peak_fraction
    assert fa2 is not None
    assert forward_s(hw, "fa2") == pytest.approx(by_hand(hw, fa2), rel=1e-9)
    faster_best = apply_hw_overrides(hw, ["gpu.efficiency.attention_forward.peak_fraction=0.8"])
    assert forward_s(faster_best, "fa2") == pytest.approx(forward_s(hw, "fa2"), rel=1e-12)
    assert hw.gpu.efficiency.exp_overlap == 1.0
    assert forward_s(faster_best, "best") == pytest.approx(by_hand(hw, 0.8, overlapped=True), rel=1e-9)


def test_without_a_measured_share_fa2_is_a_scale_of_the_best():
    hw = load_hardware("b200")
    eff = hw.gpu.efficiency
    assert eff.attention_forward.fa2_peak_fraction is None
    expected = by_hand(hw, eff.fa2_attention_scale * eff.attention_forward.peak_fraction)
    assert forward_s(hw, "fa2") == pytest.approx(expected, rel=1e-9)


def test_2024s_cudnn_runs_at_its_benchmarked_share_of_todays():
    """cuDNN's own H200 benchmark (experiments/kernels/cudnn_sdpa_h200.csv: causal BF16, head dim 128, 4K-32K
    tokens, clocks locked) at cuDNN 9.1 and 9.19: the mean ratio of their rates, forward and backward, is the
    share ``cudnn-2024`` takes of the best kernel's."""
    import csv
    from pathlib import Path
    from stageopt.hardware.efficiency import CUDNN_2024_SHARE
    rows = list(csv.DictReader(open(Path(__file__).parents[2] / "experiments" / "kernels" / "cudnn_sdpa_h200.csv")))
    rate = {(r["cudnn"], r["seq"]): (float(r["fwd_tflops"]), float(r["bwd_tflops"])) for r in rows}
    seqs = sorted({r["seq"] for r in rows}, key=int)
    for way in (0, 1):
        ratios = [rate["9.1.0", s][way] / rate["9.19.1", s][way] for s in seqs]
        assert CUDNN_2024_SHARE == pytest.approx(sum(ratios) / len(ratios), abs=0.005)
    hw = load_hardware("h100-sxm")
    share = CUDNN_2024_SHARE * hw.gpu.efficiency.attention_forward.peak_fraction
    assert forward_s(hw, "cudnn-2024") == pytest.approx(by_hand(hw, share, overlapped=True), rel=1e-9)
    assert forward_s(hw, "cudnn-2024") > forward_s(hw, "best")


def _backward_s(hw, kernel: str) -> float:
    kern = Kernels(code=np.array([KERNEL_CODES["attention_causal"]]), flops=np.array([2 * FLOPS]),
                   nbytes=np.zeros(1), m=np.zeros(1), n=np.zeros(1), k=np.array([8.0 * D]),
                   batch=np.zeros(1), precision=np.array([HIGH]), backward=np.ones(1, dtype=bool))
    return float(kernel_seconds(hw, "bf16", kern, kernel)[0])


@pytest.mark.parametrize("preset, forward, backward", [("h100-sxm", 0.85, 0.76), ("a100-80g", 0.90, 0.85)])
def test_flex_attention_takes_the_best_kernels_time_over_its_published_share(preset, forward, backward):
    """FlexAttention measured whole against its GPU generation's best kernel: 0.85 / 0.76 of FlashAttention-3 on
    H100 (GTC 2025), 0.90 / 0.85 of FlashAttention-2 on A100 (PyTorch blog, 2024), forward / backward."""
    hw = load_hardware(preset)
    eff = hw.gpu.efficiency
    launch = eff.launch_us * 1e-6
    best = by_hand(hw, eff.attention_forward.peak_fraction, overlapped=eff.exp_overlap == 1.0)
    assert forward_s(hw, "flex") == pytest.approx(launch + (best - launch) / forward, rel=1e-9)
    assert _backward_s(hw, "flex") - launch == pytest.approx((_backward_s(hw, "best") - launch) / backward, rel=1e-9)
