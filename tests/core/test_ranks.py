"""Rank order and communicator groups."""

import numpy as np

from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import all_groups, coords_of, group_members, group_size, group_stride, rank_of


def test_tp_groups_are_contiguous_ranks():
    plan = Plan.parse("tp=8 pp=4 dp=4")
    groups = all_groups(plan, "tp")
    assert groups.shape == (16, 8)
    assert all((g == np.arange(g[0], g[0] + 8)).all() for g in groups)


def test_groups_partition_the_world_and_have_no_singletons():
    plan = Plan.parse("tp=2 cp=2 pp=2 dp=4 ep=2")
    for kind in ("tp", "cp", "ep", "dp", "pp", "dp_cp", "edp_cp"):
        groups = all_groups(plan, kind)
        assert sorted(groups.ravel().tolist()) == list(range(plan.gpus))
        assert groups.shape[1] > 1


def test_singleton_axis_has_no_group():
    assert all_groups(Plan.parse("tp=1 pp=2 dp=2"), "tp").size == 0


def test_coords_round_trip_and_group_members_agree_with_all_groups():
    plan = Plan.parse("tp=2 cp=2 pp=3 dp=2")
    for r in range(plan.gpus):
        assert rank_of(plan, coords_of(plan, r)) == r
        assert group_members(plan, "dp_cp", r) in all_groups(plan, "dp_cp").tolist()


def test_pipeline_stage_is_outermost():
    plan = Plan.parse("tp=8 pp=4 dp=2")
    assert coords_of(plan, 15)["pp"] == 0 and coords_of(plan, 16)["pp"] == 1


def test_expert_groups_follow_megatron_core_factoring_with_context_parallelism():
    """A stage's tp*cp*dp ranks are etp x ep x expert-DP (Megatron-Core's expert rank generator, order
    tp-ep-dp): with etp = tp = 2, cp = 2, dp = 4 and ep = 4 the EP group takes the two CP ranks and two DP
    replicas right after the TP pair, by hand: ranks 0, 2, 4, 6 (stride etp); expert-DP steps by etp*ep = 8."""
    plan = Plan.parse("tp=2 cp=2 dp=4 ep=4 sp=on gbs=4")
    assert group_members(plan, "ep", 0) == [0, 2, 4, 6]
    assert group_members(plan, "ep", 9) == [9, 11, 13, 15]
    assert group_members(plan, "edp_cp", 1) == [1, 9]
    assert group_stride(plan, "ep") == 2 and group_stride(plan, "edp_cp") == 8
    assert group_members(plan, "dp_cp", 0) == [0, 2, 4, 6, 8, 10, 12, 14]  # dense groups are unchanged
    assert group_members(plan, "cp", 0) == [0, 2] and group_members(plan, "dp", 0) == [0, 4, 8, 12]
    for kind in ("ep", "edp_cp"):
        assert sorted(all_groups(plan, kind).ravel().tolist()) == list(range(plan.gpus))
        for r in range(plan.gpus):
            assert group_members(plan, kind, r) in all_groups(plan, kind).tolist()
    folded = Plan.parse("tp=2 cp=2 dp=2 ep=8 etp=1 sp=on gbs=2")  # etp=1: EP spans the whole stage
    assert group_members(folded, "ep", 0) == list(range(8)) and group_size(folded, "tp_edp_cp") == 1
