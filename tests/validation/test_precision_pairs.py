"""precision_pairs: rows of one source that differ only in dtype, and the gap between their errors, by hand."""

from __future__ import annotations

import pytest

from stageopt.validation import Comparison, PublishedRun, precision_pairs


def comparison(run_id: str, plan: str, measured: float, predicted: float, source: str = "A") -> Comparison:
    run = PublishedRun(id=run_id, source=source, family="", model="llama3-8b", model_set=(), gpus=8, plan=plan,
                       framework="megatron-core", hardware="h100-sxm", hw_set=(), metric="tokens_per_s_per_gpu",
                       value=measured, flops_formula="", status="ok", certainty="", citation="", assumptions="")
    return Comparison(run=run, measured=measured, predicted=predicted, iteration_time_s=1.0)


def test_pairs_bf16_with_fp8_of_the_same_plan_and_source():
    bf16 = comparison("b", "tp=1 dp=8 dtype=bf16", 100.0, 95.0)  # -5%
    fp8 = comparison("f", "tp=1 dp=8 dtype=fp8", 150.0, 162.0)  # +8%
    other_plan = comparison("o", "tp=2 dp=4 dtype=fp8", 150.0, 150.0)
    other_source = comparison("s", "tp=1 dp=8 dtype=fp8", 150.0, 150.0, source="B")
    pairs = precision_pairs([bf16, fp8, other_plan, other_source])
    assert [(h.run.id, low.run.id) for h, low, _ in pairs] == [("b", "f")]
    assert pairs[0][2] == pytest.approx(0.08 - (-0.05))


def test_a_plan_without_dtype_is_bf16():
    pairs = precision_pairs([comparison("b", "tp=1 dp=8", 100.0, 100.0), comparison("f", "tp=1 dp=8 dtype=fp8",
                                                                                     100.0, 110.0)])
    assert pairs[0][2] == pytest.approx(0.10)
