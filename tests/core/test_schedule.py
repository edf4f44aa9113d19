"""Pipeline schedules and the micro-batches they keep in flight."""

import pytest

from stageopt.parallel.plan import Plan
from stageopt.parallel.schedule import max_in_flight, stage_order


@pytest.mark.parametrize("p, m", [(4, 8), (8, 8), (4, 2)])
def test_1f1b_stage_s_holds_p_minus_s(p, m):
    plan = Plan.parse(f"pp={p} mbs=1 gbs={m}")
    for s in range(p):
        assert max_in_flight(stage_order(plan, s), 0) == min(p - s, m)


def test_gpipe_holds_every_micro_batch():
    plan = Plan.parse("pp=4 mbs=1 gbs=8 schedule=gpipe")
    assert all(max_in_flight(stage_order(plan, s), 0) == 8 for s in range(4))


@pytest.mark.parametrize("schedule, vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)])
def test_every_micro_batch_runs_forward_then_backward_once(schedule, vpp):
    plan = Plan.parse(f"pp=4 vpp={vpp} mbs=1 gbs=8 schedule={schedule}")
    for s in range(4):
        order = stage_order(plan, s)
        seen = set()
        for step in order:
            key = (step.microbatch, step.chunk)
            if step.kind == "F":
                assert key not in seen
                seen.add(key)
            else:
                assert key in seen
        assert len(order) == 2 * 8 * vpp


def test_interleaved_first_stage_in_flight_matches_megatron():
    """Megatron's warm-up on stage 0 runs (p-1)*2 + (v-1)*p forwards before the first backward."""
    p, v, m = 4, 2, 8
    plan = Plan.parse(f"pp={p} vpp={v} mbs=1 gbs={m} schedule=interleaved")
    order = stage_order(plan, 0)
    first_b = next(i for i, s in enumerate(order) if s.kind == "B")
    assert first_b == (p - 1) * 2 + (v - 1) * p + 1
