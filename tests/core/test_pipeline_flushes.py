"""Gradient accumulation over several pipeline flushes (plan ``flushes``), as torch.distributed.pipelining runs it:
each flush fills and drains the pipeline and syncs gradients; one optimizer step ends the iteration."""

from __future__ import annotations

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload
from stageopt.workload.summary import inspect_report

HW = load_hardware("h100-sxm")
MODEL = load_model("llama3-8b", ["layers=8"])


def _work(text: str):
    return build_workload(MODEL, Plan.parse(text, gpus=32), 32)


def test_each_further_flush_pays_the_fill_and_drain_and_the_gradient_sync_again() -> None:
    """1F1B on 4 stages, 16 micro-batches a step: the busy time is the same in one flush or in F, and each
    flush past the first adds one flush's bubble and exposed gradient sync, what the one-flush step shows."""
    one = AnalyticalSimulator().evaluate(_work("tp=2 pp=4 dp=4 mbs=1 gbs=64"), HW)
    b1, dp1 = one.time_breakdown_s["pipeline_bubble"], one.time_breakdown_s["exposed_dp_comm"]
    for flushes in (2, 4):
        many = AnalyticalSimulator().evaluate(_work(f"tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes={flushes}"), HW)
        assert many.time_breakdown_s["compute"] == pytest.approx(one.time_breakdown_s["compute"], rel=1e-9)
        assert many.iteration_time_s == pytest.approx(one.iteration_time_s + (flushes - 1) * (b1 + dp1), rel=1e-9)
        assert many.tokens_per_s == pytest.approx(64 * MODEL.seq / many.iteration_time_s, rel=1e-12)
        assert many.peak_memory_gib <= one.peak_memory_gib  # fewer micro-batches in flight, never more


def test_replay_runs_the_flush_its_programs_hold_back_to_back() -> None:
    """The replayed step of F flushes is F times the replayed step of one flush of gbs/F (no optimizer node)."""
    many = ReplaySimulator().evaluate(_work("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=2"), HW)
    half = ReplaySimulator().evaluate(_work("tp=2 pp=4 dp=4 mbs=1 gbs=32"), HW)
    assert many.iteration_time_s == pytest.approx(2 * half.iteration_time_s, rel=1e-12)
    assert many.tokens_per_s == pytest.approx(half.tokens_per_s, rel=1e-12)
    assert many.model_tflops_per_gpu == pytest.approx(half.model_tflops_per_gpu, rel=1e-12)


def test_flushes_read_back_and_count_the_steps_work_once() -> None:
    plan = Plan.parse("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=4", gpus=32)
    assert plan.microbatches == 4 and "flushes=4" in str(plan) and Plan.parse(str(plan)) == plan
    assert "flushes" not in str(Plan.parse("tp=2 pp=4 dp=4 mbs=1 gbs=64", gpus=32))
    one = inspect_report(_work("tp=2 pp=4 dp=4 mbs=1 gbs=64"))
    four = inspect_report(_work("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=4"))
    assert (four["microbatches"], four["flushes"]) == (16, 4)
    assert four["flops_per_iteration"] == pytest.approx(one["flops_per_iteration"], rel=1e-12)


def test_flushes_must_divide_the_steps_micro_batches() -> None:
    with pytest.raises(InfeasiblePlan, match="flushes=3 does not divide the 16 micro-batches"):
        _work("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=3")
    with pytest.raises(InfeasiblePlan, match="plan field 'flushes' must be an integer in 1..1000000"):
        Plan.parse("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=0", gpus=32)


def test_flushes_export_as_torchtitans_gradient_accumulation_and_megatron_refuses_them() -> None:
    """torchtitan runs one schedule step per local batch: a local batch of one flush's micro-batches, as many
    accumulation steps as flushes. Megatron-Core runs a step's micro-batches in one flush."""
    from stageopt.errors import ConfigError
    from stageopt.frameworks import load_profile
    from stageopt.launch import launch_settings

    plan = Plan.parse("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=4 zero=3", gpus=32, framework=load_profile("torchtitan"))
    training = launch_settings("torchtitan", MODEL, plan).settings["training"]
    assert (training["local_batch_size"], training["global_batch_size"]) == (4, 64)  # 64 / (4 ranks x 4 flushes)
    with pytest.raises(ConfigError, match="export --to megatron: Megatron-Core runs a step's micro-batches in one"):
        launch_settings("megatron", MODEL, Plan.parse("tp=2 pp=4 dp=4 mbs=1 gbs=64 flushes=4", gpus=32))
