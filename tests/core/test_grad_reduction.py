"""Gradient reduction as each stack runs it: the dtype gradients move in and the collective that reduces them.

Checked against hand-worked byte counts: Megatron-LM reduces bf16 gradients in fp32, NeMo's performance
recipes in bf16, torchtitan's FSDP2 reduce-scatters them in fp32, and DeepSpeed's BF16_Optimizer
all-reduces the whole fp32 gradient before each rank steps its ZeRO-1 shard.
"""

from __future__ import annotations

import math

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload
from stageopt.workload.memory import stage_params
from stageopt.workload.stats import stage_stats

MODEL = ("llama3-8b", ["layers=2", "seq=2048"])


def _work(text: str, framework: str):
    plan = Plan.parse(text, framework=load_profile(framework))
    return build_workload(load_model(*MODEL), plan, plan.gpus)


@pytest.mark.parametrize("framework, dtype, grad", [
    ("megatron-core", "bf16", "bf16"), ("megatron-lm-2021", "bf16", "fp32"), ("megatron-lm-2021", "fp16", "bf16"),
    ("megatron-deepspeed", "bf16", "fp32"), ("megatron-deepspeed", "fp16", "bf16"), ("torchtitan", "bf16", "fp32"),
    ("torchtitan", "fp8", "fp32"), ("llm-foundry", "bf16", "fp32")])
def test_each_stack_sets_the_gradient_dtype_and_a_plan_overrides_it(framework: str, dtype: str, grad: str) -> None:
    plan = Plan.parse(f"dp=8 gbs=8 dtype={dtype}", framework=load_profile(framework))
    assert plan.grad_dtype == grad
    mine = Plan.parse(f"dp=8 gbs=8 dtype={dtype} grad_dtype=fp32", framework=load_profile(framework))
    assert mine.grad_dtype == "fp32"


def test_a_grad_dtype_that_differs_from_the_stack_survives_the_plan_string() -> None:
    plan = Plan.parse("dp=8 gbs=8 grad_dtype=fp32")  # megatron-core reduces bf16 by default
    assert "grad_dtype=fp32" in str(plan)
    assert Plan.parse(str(plan)).grad_dtype == "fp32"
    assert "grad_dtype" not in str(Plan.parse("dp=8 gbs=8"))


@pytest.mark.parametrize("dtype, kind, grad_bytes", [("bf16", "all_reduce", 4), ("fp16", "reduce_scatter", 2)])
def test_deepspeed_zero1_reduces_as_its_optimizer_does(dtype: str, kind: str, grad_bytes: int) -> None:
    """ZeRO-1 on 8 ranks: bf16 (BF16_Optimizer) all-reduces P x 4 bytes, fp16 (ZeRO stage 1) reduce-scatters
    P x 2 bytes; both then all-gather the P x 2 bytes of updated parameters."""
    work = _work(f"dp=8 gbs=8 zero=1 dtype={dtype}", "megatron-deepspeed")
    dense, _ = stage_params(work, 0)
    uses = {(u.kind, u.phase): u for u in stage_stats(work, 0).collectives if u.group != "tp"}
    assert uses[(kind, "dp")].bytes_each == pytest.approx(dense * grad_bytes)
    assert uses[("all_gather", "dp")].bytes_each == pytest.approx(dense * 2)
    assert set(uses) == {(kind, "dp"), ("all_gather", "dp")}


def test_exposed_dp_time_of_deepspeed_bf16_is_the_fp32_all_reduce_and_the_gather() -> None:
    """No overlap on Megatron-DeepSpeed: the exposed DP time is the two collectives priced one by one in
    the stack's buckets (5e8 parameters: whole buckets of equal size), and the replay's chain of the same
    collectives gives the same number."""
    work = _work("dp=8 gbs=8 zero=1 dtype=bf16", "megatron-deepspeed")
    hw = load_hardware("a100-80g")
    dense, _ = stage_params(work, 0)
    buckets = math.ceil(dense / 5e8)
    expected = buckets * (collective_time(hw, "all_reduce", dense * 4 / buckets, 8, 1)
                          + collective_time(hw, "all_gather", dense * 2 / buckets, 8, 1))
    analytical = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"]
    assert analytical == pytest.approx(float(expected), rel=1e-9)
    assert ReplaySimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"] == pytest.approx(analytical, rel=1e-6)


def test_fsdp_scatters_fp32_gradients_per_block() -> None:
    """torchtitan ZeRO-3: each block's gradients are reduce-scattered in fp32 (4 bytes a parameter) and its
    parameters gathered in bf16 (2 bytes), twice per micro-batch (forward and backward)."""
    work = _work("dp=8 gbs=8 zero=3", "torchtitan")
    uses = {u.kind: u for u in stage_stats(work, 0).collectives if u.phase == "zero3"}
    assert uses["reduce_scatter"].bytes_each * 2 == pytest.approx(uses["all_gather"].bytes_each * 4)


def test_hybrid_sharding_is_refused_where_the_stack_all_reduces_whole_gradients() -> None:
    with pytest.raises(InfeasiblePlan, match="all-reduces whole bf16 gradients; drop dp_shard"):
        Plan.parse("dp=8 gbs=8 zero=1 dp_shard=4", framework=load_profile("megatron-deepspeed"))
