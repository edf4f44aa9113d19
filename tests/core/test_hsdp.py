"""Hybrid sharding (HSDP, ``dp_shard``): ZeRO states sharded inside a copy of ``dp_shard`` ranks, the
``dp / dp_shard`` copies all-reducing their shards. Checked against hand derivations: the rank groups
of a small case, the memory of a fully sharded plan over the same copy size, and the exposed DP time
as the sum of the three collectives priced one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.cli import main
from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import all_groups, group_members
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload
from stageopt.workload.memory import stage_memory, stage_params

MODEL = ("llama3-8b", ["layers=2", "seq=2048"])


def _work(text: str, framework: str | None = None):
    from stageopt.frameworks import load_profile

    plan = Plan.parse(text, framework=load_profile(framework) if framework else None)
    return build_workload(load_model(*MODEL), plan, plan.gpus)


def test_shard_and_replica_groups_of_a_small_case() -> None:
    """tp=2 dp=8 dp_shard=2: ranks are tp-inner, so a copy is {r, r+2} and its replicas step by tp*2 = 4."""
    plan = Plan.parse("tp=2 dp=8 zero=1 dp_shard=2")
    assert (plan.shard_dp, plan.dp_replicate) == (2, 4)
    assert group_members(plan, "shard_cp", 0) == [0, 2]
    assert group_members(plan, "replicate", 0) == [0, 4, 8, 12]
    assert group_members(plan, "replicate", 3) == [3, 7, 11, 15]
    assert group_members(plan, "dp_cp", 0) == [0, 2, 4, 6, 8, 10, 12, 14]  # the whole dp group is unchanged
    for kind in ("shard_cp", "replicate"):
        assert sorted(all_groups(plan, kind).ravel().tolist()) == list(range(plan.gpus))


def test_states_take_the_memory_of_full_sharding_over_one_copy() -> None:
    """Weights, gradients and optimizer states of dp=16 dp_shard=4 equal those of dp=4 fully sharded:
    both hold 1/4 of the stage's parameters per state."""
    for zero in (1, 2, 3):
        hybrid = stage_memory(_work(f"dp=16 gbs=16 zero={zero} dp_shard=4"), 0)
        copy = stage_memory(_work(f"dp=4 gbs=4 zero={zero}"), 0)
        assert (hybrid.weights, hybrid.gradients, hybrid.optimizer) == pytest.approx(
            (copy.weights, copy.gradients, copy.optimizer))


def test_exposed_dp_time_is_scatter_inside_the_copy_all_reduce_across_and_gather() -> None:
    """ZeRO-1 without overlap on a stack with one bucket: reduce-scatter over the 8 ranks of a node,
    all-reduce of the 1/8 shard over the 2 copies (stride 8: across nodes), all-gather over the copy."""
    work = _work("dp=16 gbs=16 zero=1 dp_overlap=off dp_shard=8", "megatron-lm-2021")
    hw = load_hardware("h100-sxm").for_stack(work.plan.framework)  # rings priced by the stack's NCCL (2.8)
    dense, _ = stage_params(work, 0)
    g, w = work.plan.grad_bytes, work.plan.weight_bytes
    expected = (collective_time(hw, "reduce_scatter", dense * g, 8, 1)
                + collective_time(hw, "all_reduce", dense * g / 8, 2, 8)
                + collective_time(hw, "all_gather", dense * w, 8, 1))
    est = AnalyticalSimulator().evaluate(work, hw)
    assert est.time_breakdown_s["exposed_dp_comm"] == pytest.approx(float(expected), rel=1e-9)


@pytest.mark.parametrize("zero", [1, 2])
def test_replay_prices_the_same_three_collectives(zero: int) -> None:
    """Without overlap the DP collectives run after the last backward, one after the other, in both
    backends: the exposed DP time must be the same number (the replay's scatter -> all-reduce -> gather
    chain against the analytical sum)."""
    work = _work(f"tp=2 dp=16 mbs=1 gbs=32 zero={zero} dp_overlap=off dp_shard=4", "megatron-lm-2021")
    hw = load_hardware("h100-sxm")
    analytical = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"]
    replay = ReplaySimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"]
    assert replay == pytest.approx(analytical, rel=1e-6)


@pytest.mark.parametrize("text, says", [
    ("dp=16 zero=0 dp_shard=8", "zero=0 shards nothing"),
    ("dp=16 zero=1 dp_shard=5", "does not divide dp=16"),
    ("dp=16 zero=1 dp_shard=8 ep=2", "not modelled; use ep=1"),
    ("dp=16 zero=1 dp_shard=32", "must be an integer in 0..dp=16"),
])
def test_a_plan_that_cannot_shard_so_is_refused_naming_the_fix(text: str, says: str) -> None:
    with pytest.raises(InfeasiblePlan, match=says):
        Plan.parse(text)


def test_sharding_over_all_of_dp_is_the_plain_plan() -> None:
    assert Plan.parse("dp=16 zero=3 dp_shard=16") == Plan.parse("dp=16 zero=3")
    assert "dp_shard=4" in str(Plan.parse("dp=16 zero=3 dp_shard=4"))
    assert Plan.parse("dp=16 zero=3 data_parallel_shard_degree=4").dp_shard == 4  # torchtitan's name


def test_a_hybrid_trace_set_generates_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "set"
    assert main(["generate", "--model", "llama3-8b", "--set", "layers=2", "--set", "seq=256",
                 "--plan", "tp=2 pp=2 dp=8 gbs=16 zero=1 dp_shard=2", "--hardware", "h100-sxm",
                 "--out", str(out), "--progress", "off"]) == 0
    assert main(["validate-trace", str(out)]) == 0
