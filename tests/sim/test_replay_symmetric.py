"""The symmetric replay backend: contract, hand-checked timelines, agreement with the analytical model."""

import numpy as np
import pytest
from contract import SimulatorContract

from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.program.nodes import COMP, NEXT, PREV, RECV, SEND, ProgramNode, StageProgram
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.stage_replay import replay_stages
from stageopt.workload import build_workload


class TestReplayContract(SimulatorContract):
    simulator = ReplaySimulator()


def comp(i, deps=(), ctrl=()):
    return ProgramNode(id=i, name=f"c{i}", type=COMP, phase="fwd", data_deps=deps, ctrl_deps=ctrl)


def test_two_stage_pipeline_by_hand():
    """Stage 0: F(1s) -> send(0.5s); stage 1: recv -> F(2s). Finish: 1 + 0.5 + 2 = 3.5 s."""
    s0 = StageProgram(0, (comp(0), ProgramNode(id=1, name="send", type=SEND, phase="p2p", data_deps=(0,),
                                                peer=NEXT, tag=7)))
    s1 = StageProgram(1, (ProgramNode(id=0, name="recv", type=RECV, phase="p2p", peer=PREV, tag=7), comp(1, (0,))))
    t0, t1 = replay_stages([s0, s1], [np.array([1.0, 0.5]), np.array([0.0, 2.0])])
    assert t0.finish_s == pytest.approx(1.5) and t1.finish_s == pytest.approx(3.5)
    assert t1.compute_s == pytest.approx(2.0) and t1.idle_s == pytest.approx(1.5)
    assert t0.exposed_s["p2p"] == pytest.approx(0.5) and t0.idle_s == pytest.approx(0.0)


def test_one_compute_slot_serializes_independent_kernels():
    prog = StageProgram(0, (comp(0), comp(1), comp(2)))
    (t,) = replay_stages([prog], [np.array([1.0, 2.0, 3.0])])
    assert t.finish_s == pytest.approx(6.0)


# tp_overlap=off: the replay does not model TP communication overlap yet (the analytical model does).
PLANS = [
    ("llama3-8b", "tp=2 pp=2 mbs=1 gbs=16 tp_overlap=off", 16),
    ("llama3-8b", "tp=4 pp=1 mbs=2 gbs=32 zero=1 sp=on tp_overlap=off", 16),
    ("llama3-70b", "tp=8 pp=4 mbs=1 gbs=64 zero=1 sp=on recompute=full tp_overlap=off", 128),
    ("gpt3-175b", "tp=8 pp=8 mbs=1 gbs=64 recompute=full tp_overlap=off", 512),
]


@pytest.mark.parametrize("model, plan, gpus", PLANS)
def test_replay_and_analytical_agree(model, plan, gpus):
    work = build_workload(load_model(model, ["layers=16"] if model != "llama3-8b" else []),
                          Plan.parse(plan, gpus=gpus), gpus)
    hw = load_hardware("h100-sxm")
    replay = ReplaySimulator().evaluate(work, hw).iteration_time_s
    analytical = AnalyticalSimulator().evaluate(work, hw).iteration_time_s
    assert analytical == pytest.approx(replay, rel=0.10)


def test_a_kernel_under_an_expert_all_to_all_progresses_at_the_contention_rate():
    """A 1 s kernel issued with a 0.5 s EP all-to-all, rate 0.4: 0.5 s at 0.4 (0.2 s of work), then 0.8 s alone.

    The kernel ends at 1.3 s = 1 + (1 - 0.4) x 0.5, the analytical model's charge for a compute-bound pair; the
    0.3 s of slowdown is exposed EP time. A kernel issued after the all-to-all ends runs at full speed.
    """
    a2a = ProgramNode(id=0, name="dispatch", type="coll", phase="fwd", collective="all_to_all", group="ep",
                      group_size=8)
    prog = StageProgram(0, (a2a, comp(1), comp(2, ctrl=(1,))))
    (t,) = replay_stages([prog], [np.array([0.5, 1.0, 0.25])], a2a_rate=0.4)
    assert t.finish_s == pytest.approx(1.3 + 0.25)
    assert t.compute_s == pytest.approx(1.25) and t.exposed_s["ep"] == pytest.approx(0.3)
    (free,) = replay_stages([prog], [np.array([0.5, 1.0, 0.25])])
    assert free.finish_s == pytest.approx(1.25) and free.exposed_s["ep"] == pytest.approx(0.0)


def test_a_kernel_beside_a_background_gradient_bucket_progresses_at_the_overlapped_rate():
    """A 2 s kernel issued with a 1 s gradient reduce-scatter on the background slot, rate 1/1.189 (H100's
    overlap_slowdown 0.189): 1 s at 1/1.189 (0.841 s of work), then 1.159 s alone; it ends at
    1 + 2 - 0.841 = 2.159 s, the analytical model's 2 + (1 - 1/1.189) x 1. The 0.159 s is exposed DP time.
    On ASTRA-sim's one slot (no background phases) the same program knows no contention."""
    rate = load_hardware("h100-sxm").gpu.efficiency.overlapped_rate
    assert rate == pytest.approx(1 / 1.189)
    bucket = ProgramNode(id=0, name="grads", type="coll", phase="dp", collective="reduce_scatter", group="dp",
                         group_size=8)
    prog = StageProgram(0, (bucket, comp(1)))
    (t,) = replay_stages([prog], [np.array([1.0, 2.0])], dp_rate=rate)
    assert t.finish_s == pytest.approx(2.0 + (1 - 1 / 1.189) * 1.0)
    assert t.compute_s == pytest.approx(2.0) and t.exposed_s["dp"] == pytest.approx((1 - 1 / 1.189) * 1.0)
    (shared,) = replay_stages([prog], [np.array([1.0, 2.0])], background=(), dp_rate=rate)
    assert shared.finish_s == pytest.approx(2.0)  # the bucket on the shared slot: the kernel runs at full speed
