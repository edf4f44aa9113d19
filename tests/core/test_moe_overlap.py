"""MoE overlap: the shared experts compute while the dispatch all-to-all is in flight (moe_overlap)."""

from stageopt.program import build_stage_program
from stageopt.program.nodes import COLL, COMP
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for
from stageopt.workload.summary import inspect_report

DSV3 = ("deepseek-v3", ["layers=4", "dense_layers=1", "seq=4096"])
PLAN = "pp=2 ep=8 mbs=1 gbs=16 zero=1 moe_overlap={}"


def test_dispatch_is_issued_before_the_shared_experts_and_nothing_else_changes():
    on, off = (workload_for(DSV3[0], PLAN.format(x), 16, framework="hai-llm", model_set=DSV3[1]) for x in ("on", "off"))
    prog = build_stage_program(on, 1)
    names = [n.name for n in prog.nodes if n.name.startswith("F0.0.0:")]
    dispatch = next(i for i, n in enumerate(names) if n.startswith("F0.0.0:all_to_all"))
    shared = next(i for i, n in enumerate(names) if ":shared.gate" in n)
    expert = next(i for i, n in enumerate(names) if ":expert.gate" in n)
    assert dispatch < shared < expert
    nodes = {n.name: n for n in prog.nodes}
    assert nodes[names[shared]].type == COMP and nodes[names[dispatch]].type == COLL
    assert nodes[names[dispatch]].id not in nodes[names[shared]].data_deps  # the shared expert does not wait
    rep_on, rep_off = inspect_report(on), inspect_report(off)
    assert rep_on["flops_per_iteration"] == rep_off["flops_per_iteration"]
    assert [s["collectives"] for s in rep_on["stages"]] == [s["collectives"] for s in rep_off["stages"]]


def test_exposed_expert_all_to_all_shrinks_in_both_simulators():
    for sim in (None, ReplaySimulator()):
        est = {x: simulate_plan(DSV3[0], PLAN.format(x), 16, framework="hai-llm", model_set=DSV3[1], simulator=sim)[1]
               for x in ("on", "off")}
        assert est["on"].time_breakdown_s["exposed_ep_comm"] < est["off"].time_breakdown_s["exposed_ep_comm"]
