"""Rank order and communicator groups."""

import numpy as np

from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import all_groups, coords_of, group_members, rank_of


def test_tp_groups_are_contiguous_ranks():
    plan = Plan.parse("tp=8 pp=4 dp=4")
    groups = all_groups(plan, "tp")
    assert groups.shape == (16, 8)
    assert all((g == np.arange(g[0], g[0] + 8)).all() for g in groups)


def test_groups_partition_the_world_and_have_no_singletons():
    plan = Plan.parse("tp=2 cp=2 pp=2 dp=4 ep=2")
    for kind in ("tp", "cp", "ep", "dp", "edp", "pp", "dp_cp", "edp_cp"):
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
