"""Combined-1F1B all-to-all overlap (ep_overlap; Megatron-Core's --overlap-moe-expert-parallel-comm), by hand.

Without a pipeline, m micro-batches run F0, then m-1 merged steps (F of one
micro-batch with B of the one before), then the last B. A merged step costs the
two passes' compute plus their all-to-alls, less the share ``s`` of the
overlapped time that contention leaves as a saving (the GPU's
``a2a_overlap_saving``), so where compute is the larger one:

    t_on = t_off - s * (m - 1) * exposed_ep_off / m.

The backward frees a layer as the forward saves one, so the activation peak
stays one micro-batch's (Megatron-Bridge measured 62 GiB with it on in its
Qwen3-30B-A3B study, `skills/nemo-mbridge-perf-expert-parallel-overlap`).
"""

from __future__ import annotations

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.launch import launch_settings
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.parallel.schedule import schedule_orders
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan

MOE = ("mixtral-8x7b", ["layers=4", "hidden=2048", "heads=16", "kv_heads=4", "ffn=768", "experts=64", "top_k=8",
                        "expert_ffn=768", "seq=4096"])
PLAN = "tp=1 pp=1 dp=8 ep=8 mbs=1 gbs=32 zero=1 recompute=none ep_overlap={}"


def run(overlap: str, simulator=None, plan: str = PLAN):
    return simulate_plan(MOE[0], plan.format(overlap), None, model_set=MOE[1], simulator=simulator)[1]


def steps(order):
    return [(s.microbatch, s.kind, s.paired) for s in order]


def test_without_a_pipeline_each_forward_pairs_with_the_previous_backward():
    (order,) = schedule_orders("1f1b", 1, 1, 4, True)
    assert steps(order) == [(0, "F", False), (1, "F", True), (0, "B", False), (2, "F", True), (1, "B", False),
                            (3, "F", True), (2, "B", False), (3, "B", False)]


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8)])
def test_interleaved_pairs_join_different_micro_batches_after_one_more_warmup_forward(p, v, m):
    plain, merged = schedule_orders("interleaved", p, v, m), schedule_orders("interleaved", p, v, m, True)
    for stage, (a, b) in enumerate(zip(plain, merged)):
        assert sorted((s.microbatch, s.chunk, s.kind) for s in a) == sorted((s.microbatch, s.chunk, s.kind) for s in b)
        warm = min((p - stage - 1) * 2 + (v - 1) * p, m * v)
        assert [s.kind for s in b[:warm + 1]] == ["F"] * min(warm + 1, m * v)
        for first, second in zip(b, b[1:]):
            if first.paired:
                assert (first.kind, second.kind) == ("F", "B")
                assert (first.microbatch, first.chunk) != (second.microbatch, second.chunk)
        assert sum(s.paired for s in b) == m * v - warm - 1


def test_merged_steps_hide_all_but_one_micro_batch_of_all_to_alls_when_compute_is_larger():
    off, on = run("off"), run("on")
    m = 32 // 8
    ep = off.time_breakdown_s["exposed_ep_comm"]
    assert 0 < ep / m < off.time_breakdown_s["compute"] / m  # compute-bound merged steps
    saving = load_hardware("h100-sxm").gpu.efficiency.a2a_overlap_saving
    assert 0 < saving < 1
    assert on.iteration_time_s == pytest.approx(off.iteration_time_s - saving * (m - 1) * ep / m, rel=1e-6)
    assert on.peak_memory_gib == pytest.approx(off.peak_memory_gib, rel=1e-9)


def test_replay_runs_the_pairs_overlapped_and_keeps_the_memory():
    off, on = run("off", ReplaySimulator()), run("on", ReplaySimulator())
    assert on.iteration_time_s < off.iteration_time_s
    assert on.time_breakdown_s["exposed_ep_comm"] < off.time_breakdown_s["exposed_ep_comm"]
    assert on.peak_memory_gib == pytest.approx(off.peak_memory_gib, rel=1e-9)
    # Kernels under the all-to-alls slow down as the analytical model charges; the replay's dependencies also
    # leave part of each all-to-all unhidden, so it lands a little above the analytical figure.
    analytical = run("on").iteration_time_s
    assert analytical <= on.iteration_time_s < 1.05 * analytical
    # ASTRA-sim's rules price no contention: the same pairs under them run faster.
    assert run("on", ReplaySimulator(dp_stream="shared")).iteration_time_s < on.iteration_time_s


def test_interleaved_plan_holds_one_more_chunk_micro_batch_at_most():
    plan = "tp=1 pp=2 vpp=2 schedule=interleaved dp=4 ep=4 mbs=1 gbs=32 zero=1 recompute=none ep_overlap={}"
    off, on = run("off", plan=plan), run("on", plan=plan)
    assert on.iteration_time_s < off.iteration_time_s
    extra = on.memory_breakdown_gib["activations"] - off.memory_breakdown_gib["activations"]
    one_chunk = off.memory_breakdown_gib["activations"] / ((2 - 0 - 1) * 2 + (2 - 1) * 2 + 1) * 2
    assert 0 <= extra <= one_chunk * 1.01


@pytest.mark.parametrize(("plan", "field"), [
    ("tp=1 pp=2 dp=4 ep=4 ep_overlap=on", "interleaved"),
    ("tp=1 pp=1 dp=8 ep=8 recompute=full ep_overlap=on", "recompute=full"),
    ("tp=1 pp=1 dp=8 ep=8 moe_overlap=on ep_overlap=on", "moe_overlap=off"),
])
def test_plans_megatron_refuses_are_refused_with_the_fix(plan, field):
    with pytest.raises(InfeasiblePlan, match=field):
        Plan.parse(plan)


def test_without_expert_parallelism_there_is_nothing_to_overlap():
    assert Plan.parse("tp=1 pp=2 dp=4 ep=1 ep_overlap=on") == Plan.parse("tp=1 pp=2 dp=4 ep=1")


def test_megatron_and_bridge_spellings_parse_and_export():
    plan = Plan.parse("tp=1 pp=1 dp=8 ep=8 gbs=32 moe_a2a_overlap=on")
    assert plan.ep_overlap and Plan.parse("ep=8 dp=8 overlap-moe-expert-parallel-comm=on").ep_overlap
    assert "ep_overlap=on" in str(plan)
    model = load_model(MOE[0], MOE[1])
    assert "--overlap-moe-expert-parallel-comm" in launch_settings("megatron", model, plan).text
    bridge = launch_settings("megatron-bridge", model, plan).text
    assert "comm_overlap.overlap_moe_expert_parallel_comm=true" in bridge
    with pytest.raises(Exception, match="ep_overlap=off"):
        launch_settings("torchtitan", model, plan.replace(zero=2))


def test_search_merges_overlap_without_expert_parallelism():
    """Canonical rule 13: the search must not list ep=1 twice (on and off are one plan)."""
    from stageopt.frameworks import load_profile
    from stageopt.search.candidate import canonical
    from stageopt.search.dimensions import PLAN_DEFAULTS
    model = load_model(MOE[0], MOE[1])
    values = {**PLAN_DEFAULTS, "tp": 1, "pp": 1, "ep": 1, "ep_overlap": True, "gbs": 32}
    assert canonical(values, 8, model, load_profile("megatron-core"))["ep_overlap"] is False
    assert canonical({**values, "ep": 8}, 8, model, load_profile("megatron-core"))["ep_overlap"] is True
