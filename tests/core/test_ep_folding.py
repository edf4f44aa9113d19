"""MoE parallel folding over TP (Megatron-Core, etp=1): expert parallelism spans tp x a factor of dp, so ep may
exceed dp (Qwen3-235B's recipe: tp=2 dp=16 ep=32). Each rank still routes its own sequence-parallel tokens and
holds ep-th of the experts whole: per-rank sizes equal those of the unfolded plan with the same ep; only the
groups differ, checked here by hand on small cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.cli import main
from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time
from stageopt.model import load_model
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import coords_of, expert_dp_group, group_members, group_size
from stageopt.program import ProgramOptions, build_programs
from stageopt.program.durations import node_durations
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload
from stageopt.workload.stats import stage_stats

MODEL = ("mixtral-8x7b", ["layers=2", "seq=2048", "experts=32"])


def _work(text: str):
    plan = Plan.parse(text)
    return build_workload(load_model(*MODEL), plan, plan.gpus)


def test_ep_spans_tp_and_a_factor_of_dp() -> None:
    plan = Plan.parse("tp=2 dp=4 ep=8 etp=1 sp=on gbs=8")
    assert plan.expert_dp_ranks == 1
    assert group_members(plan, "ep", 0) == list(range(8))  # both TP ranks of all four replicas
    assert expert_dp_group(plan) == "tp_edp_cp" and group_size(plan, "tp_edp_cp") == 1  # each rank its own experts
    assert group_members(plan, "dp_cp", 0) == [0, 2, 4, 6]  # dense gradients as before
    wider = Plan.parse("tp=4 dp=8 ep=16 etp=1 sp=on gbs=8")  # folded: ep's dp factor 4, two expert-DP copies
    assert sorted({coords_of(wider, r)["dp"] for r in range(wider.gpus)}) == list(range(8))  # a rank's dp index


def test_per_rank_experts_and_dispatch_equal_the_unfolded_plan_with_the_same_ep() -> None:
    folded, flat = _work("tp=2 dp=16 ep=32 etp=1 sp=on mbs=1 gbs=16"), _work("tp=2 dp=32 ep=32 etp=1 sp=on mbs=1 gbs=32")
    assert sum(folded.value(k, "local_expert") for k in folded.blocks) == \
        sum(flat.value(k, "local_expert") for k in flat.blocks)  # 32 / 32 = 1 whole expert per rank
    per_mb = [sorted((c.bytes_each, c.count) for c in stage_stats(w, 0).collectives if c.group == "ep")
              for w in (folded, flat)]
    assert per_mb[0] == per_mb[1]  # one micro-batch per replica in both
    for w in (folded, flat):
        assert group_size(w.plan, "ep") == 32


def test_folding_needs_whole_experts_on_each_tp_rank() -> None:
    model = load_model(*MODEL)
    with pytest.raises(InfeasiblePlan, match=r"ep=8 x etp=2 does not divide a stage's tp=2 x cp=1 x dp=4 = 8 ranks.*or etp=1"):
        validate_plan(Plan.parse("tp=2 dp=4 ep=8 sp=on gbs=8"), model, 8)
    validate_plan(Plan.parse("tp=2 dp=4 ep=8 etp=1 sp=on gbs=8"), model, 8)


def test_the_folded_dispatch_runs_inside_one_node_in_every_backend(tmp_path: Path) -> None:
    """tp=2 x 4 replicas = 8 contiguous ranks: each all-to-all is priced on one NVLink node (stride 1), in
    the replay's program as in the analytical model, and the trace set validates."""
    work, hw = _work("tp=2 dp=4 ep=8 etp=1 sp=on mbs=1 gbs=8"), load_hardware("h100-sxm")
    analytical = _dispatch_priced_on(work, hw, 8, 1, tmp_path)
    replay = ReplaySimulator().evaluate(work, hw).time_breakdown_s["exposed_ep_comm"]
    assert 0 < replay <= analytical * (1 + 1e-9)  # the replay may hide part under the other micro-batch's compute


def _dispatch_priced_on(work, hw, size: int, stride: int, tmp_path: Path) -> float:
    """Every EP all-to-all of the program costs ``collective_time`` over (size, stride); the analytical
    model charges their sum (all exposed), which it returns; the plan's trace set validates."""
    program = build_programs(work, ProgramOptions())[0]
    durations = node_durations(program, work, hw)
    dispatches = [n for n in program.nodes if n.group == "ep"]
    assert dispatches and all(
        durations[n.id] == pytest.approx(float(collective_time(hw, "all_to_all", n.comm_size, size, stride)))
        for n in dispatches)
    analytical = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_ep_comm"]
    assert analytical == pytest.approx(sum(durations[n.id] for n in dispatches))
    out = tmp_path / "set"
    assert main(["generate", "--model", "mixtral-8x7b", "--set", "layers=2", "--set", "seq=2048", "--set",
                 "experts=32", "--plan", str(work.plan), "--hardware", hw.name,
                 "--out", str(out), "--progress", "off"]) == 0
    assert main(["validate-trace", str(out)]) == 0
    return analytical


def test_ep_folds_over_context_parallelism_as_megatron_core_builds_it(tmp_path: Path) -> None:
    """tp=2 cp=4 dp=1 ep=4 (NeMo's Mixtral 8x22B B200 recipe shape: ep exceeds dp): with etp = tp the
    expert layers take a stage's 8 ranks as etp 2 x ep 4, so each EP group is the four CP ranks of one TP
    index, ranks 0, 2, 4, 6 (stride 2) inside one node; every backend prices the dispatch so."""
    text = "tp=2 cp=4 dp=1 ep=4 sp=on mbs=1 gbs=2"
    plan = Plan.parse(text)
    validate_plan(plan, load_model(*MODEL), 8)
    assert group_members(plan, "ep", 0) == [0, 2, 4, 6] and group_members(plan, "ep", 1) == [1, 3, 5, 7]
    assert plan.expert_dp_ranks == 1  # each TP pair's four CP ranks hold the 32 experts between them
    _dispatch_priced_on(_work(text), load_hardware("h100-sxm"), 4, 2, tmp_path)
