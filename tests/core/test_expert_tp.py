"""Expert tensor parallelism apart from dense TP (``etp``): with etp=1 every TP rank holds whole experts and
routes its own sequence-parallel tokens through them. Checked by hand: the expert weights per GPU grow by tp,
the optimizer states do not (they shard over tp x expert-DP), the all-to-all carries 1/tp of the bytes, and
the TP collectives around the experts are gone."""

from __future__ import annotations

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.launch import launch_settings
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import expert_dp_group, group_size
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload
from stageopt.workload.memory import stage_memory
from stageopt.workload.stats import stage_stats

MODEL = ("mixtral-8x7b", ["layers=2", "seq=2048"])
PLAN = "tp=4 pp=1 dp=16 ep=8 mbs=1 gbs=64 zero=1 sp=on"


def _work(extra: str = ""):
    plan = Plan.parse(f"{PLAN} {extra}")
    return build_workload(load_model(*MODEL), plan, plan.gpus)


def test_whole_experts_cost_tp_times_the_weights_and_the_same_optimizer_states() -> None:
    split, whole = _work(), _work("etp=1")
    expert_split = sum(split.value(k, "local_expert") for k in split.blocks)
    expert_whole = sum(whole.value(k, "local_expert") for k in whole.blocks)
    assert expert_whole == pytest.approx(4 * expert_split)
    a, b = stage_memory(split, 0), stage_memory(whole, 0)
    assert b.weights - a.weights == pytest.approx(2 * 2 * (expert_whole - expert_split))  # bf16 bytes x 2 layers
    assert b.optimizer == pytest.approx(a.optimizer)  # sharded over tp x edp = 4 x 2 instead of edp = 2


def test_the_dispatch_carries_one_tp_share_and_no_tp_collective_wraps_the_experts() -> None:
    def ep_and_tp(work):
        colls = stage_stats(work, 0).collectives
        ep = sum(c.count * c.bytes_each for c in colls if c.group == "ep")
        tp = sum(c.count for c in colls if c.group == "tp" and c.phase != "dp")
        return ep, tp

    (ep_split, tp_split), (ep_whole, tp_whole) = ep_and_tp(_work()), ep_and_tp(_work("etp=1"))
    assert ep_whole == pytest.approx(ep_split / 4)
    # per layer and micro-batch: the gather before and the scatter after the experts, forward and backward;
    # 2 layers, 64 / (1 x 16) = 4 micro-batches
    assert tp_split - tp_whole == 4 * 2 * 4


def test_expert_gradients_reduce_over_tp_and_expert_data_parallel_ranks() -> None:
    plan = Plan.parse(f"{PLAN} etp=1")
    assert expert_dp_group(plan) == "tp_edp_cp" and group_size(plan, "tp_edp_cp") == 4 * 2
    assert expert_dp_group(Plan.parse(PLAN)) == "edp_cp"


def test_both_backends_price_the_same_dispatch() -> None:
    work, hw = _work("etp=1"), load_hardware("h100-sxm")
    analytical = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_ep_comm"]
    replay = ReplaySimulator().evaluate(work, hw).time_breakdown_s["exposed_ep_comm"]
    assert replay == pytest.approx(analytical, rel=1e-6)


@pytest.mark.parametrize("text, says", [
    (f"{PLAN} etp=2", "must be 1 or tp=4"),
    ("tp=4 dp=16 ep=8 gbs=64 sp=off etp=1", "needs sequence parallelism"),
])
def test_an_expert_split_that_is_not_modelled_is_refused(text: str, says: str) -> None:
    with pytest.raises(InfeasiblePlan, match=says):
        Plan.parse(text)


def test_exports_name_the_expert_tp_that_was_simulated() -> None:
    model = load_model(*MODEL)
    text = launch_settings("megatron", model, Plan.parse(f"{PLAN} etp=1")).text
    assert "--expert-tensor-parallel-size 1" in " ".join(text.split())
    assert Plan.parse(f"{PLAN} etp=4").etp == 0 and "etp=1" in str(Plan.parse(f"{PLAN} etp=1"))
