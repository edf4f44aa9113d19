"""Micro-batch groups of the interleaved schedule (Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage).

Independent derivations: the schedule Megatron-Core's own documentation draws for PP=2 VP=2 (ModelParallelConfig.
microbatch_group_size_per_vp_stage), its warm-up count ((p - s - 1) * 2 + (v - 1) * N), and the activation peak
found by walking the step order (stageopt.workload.memory) against the analytical model's closed form.
"""

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.parallel.schedule import stage_order
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import hardware_for, workload_for
from stageopt.workload.memory import stage_memory

SMALL = ("layers=16", "hidden=1024", "heads=16", "kv_heads=16", "ffn=4096", "vocab=32000", "seq=2048")


def _forward_microbatches(plan: Plan, stage: int) -> list[tuple[int, int]]:
    return [(s.microbatch, s.chunk) for s in stage_order(plan, stage) if s.kind == "F"]


def test_groups_of_three_run_as_megatron_core_documents():
    """PP=2 VP=2, N=3, M=5: rank 0 runs micro-batches 0 1 2 0 1 2 3 4 3 4 (chunk 0 then chunk 1 per group)."""
    plan = Plan.parse("pp=2 vpp=2 vpp_group=3 mbs=1 gbs=5 dp=1 schedule=interleaved")
    for stage in range(2):
        got = _forward_microbatches(plan, stage)
        assert [mb for mb, _ in got] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
        assert [chunk for _, chunk in got] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_the_default_group_is_pp():
    grouped = Plan.parse("pp=4 vpp=2 vpp_group=4 mbs=1 gbs=8 schedule=interleaved")
    default = Plan.parse("pp=4 vpp=2 mbs=1 gbs=8 schedule=interleaved")
    assert all(stage_order(grouped, s) == stage_order(default, s) for s in range(4))


@pytest.mark.parametrize("group", [4, 6, 12])
def test_warm_up_runs_v_minus_one_groups_ahead(group):
    p, v, m = 4, 2, 12
    plan = Plan.parse(f"pp={p} vpp={v} vpp_group={group} mbs=1 gbs={m} schedule=interleaved")
    for s in range(p):
        order = stage_order(plan, s)
        first_backward = next(i for i, step in enumerate(order) if step.kind == "B")
        assert first_backward == (p - s - 1) * 2 + (v - 1) * group + 1


@pytest.mark.parametrize("group", [4, 8])
def test_analytical_activation_peak_is_the_walked_order(group):
    """The closed form's in-flight count must match the order the traces encode, for every group size."""
    plan = f"tp=1 pp=4 vpp=2 vpp_group={group} mbs=1 gbs=16 schedule=interleaved recompute=none"
    work = workload_for("llama3-8b", plan, 4, model_set=SMALL)
    est = AnalyticalSimulator().evaluate(work, hardware_for("h100-sxm"))
    walked = max(stage_memory(work, s).activations for s in range(4)) / 2**30
    assert est.memory_breakdown_gib["activations"] == pytest.approx(walked, rel=1e-6)


def test_larger_groups_hold_more_but_cost_no_bubble():
    """N above pp deepens the warm-up (memory) without a dependency wait: the replayed step time is unchanged."""
    hw = hardware_for("h100-sxm")
    times, memory = [], []
    for group in (4, 8):
        work = workload_for("llama3-8b", f"pp=4 vpp=2 vpp_group={group} mbs=1 gbs=16 schedule=interleaved", 4,
                            model_set=SMALL)
        est = ReplaySimulator().evaluate(work, hw)
        times.append(est.iteration_time_s)
        memory.append(est.memory_breakdown_gib["activations"])
    assert times[1] == pytest.approx(times[0], rel=0.01)
    assert memory[1] > memory[0]


@pytest.mark.parametrize("text, fragment", [
    ("pp=4 vpp=2 vpp_group=2 mbs=1 gbs=8 schedule=interleaved", "must lie in [pp=4"),
    ("pp=4 vpp=2 vpp_group=4 mbs=1 gbs=10 schedule=interleaved", "divisible by pp=4"),
    ("pp=4 vpp=2 vpp_group=7 mbs=1 gbs=10 schedule=interleaved", "leave 3, fewer than pp=4"),
    ("pp=4 vpp_group=6 mbs=1 gbs=12", "set schedule=interleaved"),
])
def test_groups_megatron_core_rejects_are_refused_in_one_line(text, fragment):
    with pytest.raises(InfeasiblePlan) as err:
        plan = Plan.parse(text)
        validate_plan(plan, workload_for("llama3-8b", "pp=1", 1, model_set=SMALL).model)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_last_group_of_at_least_pp_lets_micro_batches_skip_divisibility():
    """M=10 with pp=4 is refused by the default groups but accepted in groups of 6 (remainder 4 >= pp)."""
    plan = Plan.parse("pp=4 vpp=2 microbatch_group_size_per_vp_stage=6 mbs=1 gbs=10 schedule=interleaved")
    validate_plan(plan, workload_for("llama3-8b", "pp=1", 1, model_set=SMALL).model)
    assert plan.vpp_group == 6 and "vpp_group=6" in str(plan)
    assert Plan.parse(str(plan)) == plan
