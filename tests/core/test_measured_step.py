"""A whole measured training step on one H100 against ``stageopt simulate`` (experiments/kernels/h100/).

Independent of the model on both sides: the step is a real eager PyTorch forward
and backward of a torchtitan-style Llama (4 layers of Llama 3 8B at 8K tokens, 2
layers of Llama 3 70B at 4K; cuDNN and FlashAttention-2 attention), and the kernel
shares come from GEMMs and attention kernels timed alone on the same GPU. Nothing
is fitted to the step, so this checks the itemization as a whole: which kernels the
torchtitan profiles launch, their bytes and FLOPs, and the launch costs between them.
By kernel family the profiler shows compensating errors (experiments/kernels/README.md):
GEMMs priced 12-18% slow (they run at the clock a GPU holds under GEMMs alone), the
element-wise kernels 16-17% fast (eager copies the profile does not itemize).
FlashAttention-2 runs at its own measured shares (0.301 / 0.257 on this H100); before
they were priced as 0.55 x cuDNN's, faster than FA2 measures alone, and the two FA2
steps came out +1.1% and +1.6%; at FA2's own rates they come out +3.4% and +2.3%.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "kernels"


def _compare_step():
    if not (KERNELS / "h100" / "step").is_dir():
        pytest.skip("experiments/kernels/h100/step not in this checkout")
    spec = importlib.util.spec_from_file_location("compare_step", KERNELS / "compare_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_measured_single_gpu_step_is_predicted_within_4_percent_from_kernels_timed_alone():
    rows = _compare_step().compare(KERNELS / "h100", "h100-sxm")
    assert {(r["config"], r["attention"]) for r in rows} == {
        (c, a) for c in ("llama3-8b-4l", "llama3-70b-2l") for a in ("cudnn", "flash")}
    for r in rows:
        assert r["kernels_alone_s"] == pytest.approx(r["measured_s"], rel=0.04), r
