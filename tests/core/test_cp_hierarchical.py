"""Hierarchical context parallelism (``cp_comm=a2a+p2p``, Megatron-Core's ``--hierarchical-context-parallel-sizes``):
Ulysses all-to-alls inside groups of ``cp_a2a`` ranks, then a K/V ring over the ``cp / cp_a2a`` groups. The
collectives the graph derives are checked against the sizes worked out by hand for Llama 3 8B (32 query and 8
K/V heads of 128, bf16) on tp=2 cp=8 with cp_a2a=4."""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.cli import main
from stageopt.errors import InfeasiblePlan
from stageopt.launch import launch_settings
from stageopt.model import load_model
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import group_members
from stageopt.workload import build_workload
from stageopt.workload.stats import stage_stats

SEQ = 65536
MODEL = ("llama3-8b", ["layers=2", f"seq={SEQ}"])
PLAN = "tp=2 cp=8 dp=2 mbs=1 gbs=4"


def _stats(extra: str):
    plan = Plan.parse(f"{PLAN} {extra}")
    work = build_workload(load_model(*MODEL), plan, plan.gpus)
    return stage_stats(work, 0)


def test_all_to_alls_inside_the_group_and_a_ring_over_the_groups_of_the_worked_sizes() -> None:
    uses = _stats("cp_comm=a2a+p2p cp_a2a=4").collectives
    colls = {(c.group, c.kind, c.phase): c for c in uses}
    local_seq = SEQ // 8  # before the all-to-all: the sequence split over all 8 CP ranks
    q_bytes = local_seq * (32 // 2) * 128 * 2  # this rank's queries: its TP share of the heads
    kv_bytes = local_seq * (8 // 2) * 128 * 2
    a2a = sorted({c.bytes_each for c in uses if c.group == "cpa"})
    assert a2a == [kv_bytes, q_bytes]  # q, k, v and the output traded for heads over 4 ranks
    ring = colls[("cp", "all_gather", "fwd")]
    # after it: the sequence split over the 2 ring groups, 8 / (2 x 4) = 1 K/V head; gathered over 2 ranks
    assert ring.group_size == 2 and ring.bytes_each == 2 * (SEQ // 2) * 1 * 128 * 2
    assert colls[("cpa", "all_to_all", "fwd")].group_size == 4


def test_the_mix_does_the_same_work_as_the_ring() -> None:
    assert _stats("cp_comm=a2a+p2p cp_a2a=4").flops == pytest.approx(_stats("cp_comm=p2p").flops)


def test_groups_nest_the_all_to_all_inside_the_ring() -> None:
    plan = Plan.parse(f"{PLAN} cp_comm=a2a+p2p cp_a2a=4")
    assert group_members(plan, "cpa", 0) == [0, 2, 4, 6]  # stride tp
    assert group_members(plan, "cp", 0) == [0, 8]  # stride tp x cp_a2a
    assert group_members(plan, "dp_cp", 0) == list(range(0, 32, 2))  # every CP rank and both replicas


@pytest.mark.parametrize("text, says", [
    ("cp_comm=a2a+p2p", "needs cp_a2a"),
    ("cp_comm=a2a+p2p cp_a2a=3", "needs cp_a2a"),
    ("cp_comm=a2a+p2p cp_a2a=8", "with all of cp use cp_comm=a2a"),
])
def test_a_hierarchy_that_does_not_nest_is_refused(text: str, says: str) -> None:
    with pytest.raises(InfeasiblePlan, match=says):
        Plan.parse(f"{PLAN} {text}")


def test_heads_must_split_over_tp_and_the_all_to_all_part_only() -> None:
    model = load_model(*MODEL)
    with pytest.raises(InfeasiblePlan, match="does not divide kv_heads=8"):
        validate_plan(Plan.parse(f"{PLAN} cp_comm=a2a"), model, 32)  # 2 x 8 = 16 ranks for 8 K/V heads
    validate_plan(Plan.parse(f"{PLAN} cp_comm=a2a+p2p cp_a2a=4"), model, 32)  # 2 x 4 = 8: fits


def test_megatron_export_names_both_levels() -> None:
    text = launch_settings("megatron", load_model(*MODEL), Plan.parse(f"{PLAN} cp_comm=a2a+p2p cp_a2a=4")).text
    flat = " ".join(text.split())
    assert "--cp-comm-type a2a+p2p" in flat and "--hierarchical-context-parallel-sizes 4 2" in flat


def test_a_hierarchical_trace_set_generates_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "set"
    assert main(["generate", "--model", "llama3-8b", "--set", "layers=2", "--set", "seq=4096", "--plan",
                 "tp=2 cp=8 dp=2 gbs=4 cp_comm=a2a+p2p cp_a2a=4", "--hardware", "h100-sxm", "--out", str(out),
                 "--progress", "off"]) == 0
    assert main(["validate-trace", str(out)]) == 0
