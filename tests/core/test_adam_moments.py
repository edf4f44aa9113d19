"""Adam's moments in bf16 (Megatron-Core's precision-aware optimizer): 4 + 2 + 2 bytes of optimizer state
per parameter instead of 4 + 4 + 4, in memory and in the optimizer step's traffic."""

from __future__ import annotations

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.workload import build_workload
from stageopt.workload.memory import stage_memory, stage_params

MODEL = load_model("llama3-8b", ["layers=2", "seq=2048"])


def _work(extra: str = ""):
    return build_workload(MODEL, Plan.parse(f"dp=8 gbs=8 zero=1 dp_overlap=off {extra}"), 8)


def test_optimizer_state_is_eight_bytes_a_parameter_sharded_over_dp() -> None:
    dense, _ = stage_params(_work(), 0)
    assert stage_memory(_work(), 0).optimizer == pytest.approx(dense / 8 * 12)
    assert stage_memory(_work("adam_moments=bf16"), 0).optimizer == pytest.approx(dense / 8 * 8)


def test_the_optimizer_step_streams_the_smaller_states() -> None:
    """One fused Adam kernel reads and writes master weights and both moments, reads the gradient and
    writes the bf16 weight: (2 x 8 + 2 + 2) against (2 x 12 + 2 + 2) bytes per local parameter."""
    hw = load_hardware("h100-sxm")
    local = stage_params(_work(), 0)[0] / 8
    for extra, state in (("", 12), ("adam_moments=bf16", 8)):
        got = AnalyticalSimulator().evaluate(_work(extra), hw).time_breakdown_s["optimizer"]
        assert got == pytest.approx(float(hw.gpu.vector_time_s(local * (2 * state + 2 + 2))), rel=1e-9)


def test_the_field_is_checked_and_survives_the_plan_string() -> None:
    plan = Plan.parse("dp=8 gbs=8 adam_moments=bf16")
    assert plan.optimizer_bytes == 8 and Plan.parse(str(plan)).adam_moments == "bf16"
    with pytest.raises(InfeasiblePlan, match="'adam_moments' must be fp32 or bf16"):
        Plan.parse("dp=8 gbs=8 adam_moments=fp8")


def test_a_stack_without_master_weights_holds_only_the_moments_and_bf16_gradients() -> None:
    """NeMo AutoModel steps a model loaded in bf16 with torch.optim.Adam: no fp32 master copy, moments in bf16
    (2 + 2 bytes a sharded parameter) and the fp32-reduced gradient cast back to the bf16 parameter (2 bytes, not
    the 4 of its reduction dtype); Megatron-Core holds 4 + 4 + 4 and its gradients in its bf16 reduction dtype."""
    from stageopt.frameworks import load_profile

    stack = load_profile("nemo-automodel-te")
    plan = Plan.parse("dp=8 gbs=8 zero=3 adam_moments=bf16", framework=stack)
    assert (plan.optimizer_bytes, plan.grad_held_bytes, plan.grad_bytes) == (4, 2, 4)
    work = build_workload(MODEL, plan, 8)
    dense, _ = stage_params(work, 0)
    mem = stage_memory(work, 0)
    assert mem.optimizer == pytest.approx(dense / 8 * 4)
    assert mem.gradients == pytest.approx(dense / 8 * 2)
    megatron = stage_memory(build_workload(MODEL, Plan.parse("dp=8 gbs=8 zero=3"), 8), 0)
    assert (megatron.optimizer, megatron.gradients) == (pytest.approx(dense / 8 * 12), pytest.approx(dense / 8 * 2))
