"""Compute beside a data-parallel collective slows down (gpu.efficiency.overlap_slowdown, Lee et al. 2025).

Of each second a gradient bucket (or a ZeRO-1 parameter gather) hides under compute, the step loses
1 - 1 / (1 + overlap_slowdown): the kernels beside it progress at that rate. Checked in closed form against
the same plan with the overlap off (everything exposed, nothing contends) and with no contention (only the
last bucket exposed), and the replay's timeline against the analytical model's charge.
"""

from __future__ import annotations

import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload

PLAN = "tp=1 pp=1 dp=64 mbs=1 gbs=64 zero=0 recompute=none"  # one micro-batch: the whole sync beside backward


def _exposed_dp(plan: str, hw_set=(), simulator=None):
    work = build_workload(load_model("llama3-8b", ["layers=8"]), Plan.parse(plan), 64)
    est = (simulator or AnalyticalSimulator()).evaluate(work, hardware_for("h100-sxm", hw_set))
    return est.time_breakdown_s["exposed_dp_comm"], est.iteration_time_s


def test_hidden_sync_costs_the_contention_share_of_itself():
    free, _ = _exposed_dp(PLAN, ["gpu.efficiency.overlap_slowdown=0"])
    whole, _ = _exposed_dp(f"{PLAN} dp_overlap=off")
    assert whole == pytest.approx(_exposed_dp(f"{PLAN} dp_overlap=off", ["gpu.efficiency.overlap_slowdown=0"])[0])
    contended, _ = _exposed_dp(PLAN)
    share = 1 - 1 / 1.189  # H100's overlap_slowdown, the default every GPU inherits
    assert free < whole and contended == pytest.approx(free + share * (whole - free), rel=1e-9)


def test_the_replay_charges_what_the_analytical_model_does():
    """The replay slows each kernel issued while a background bucket is in flight; over a whole backward
    that adds up to the closed form's charge, to within the replay's bucket timing."""
    _, analytical = _exposed_dp(PLAN)
    _, analytical_free = _exposed_dp(PLAN, ["gpu.efficiency.overlap_slowdown=0"])
    _, replay = _exposed_dp(PLAN, simulator=ReplaySimulator())
    _, replay_free = _exposed_dp(PLAN, ["gpu.efficiency.overlap_slowdown=0"], ReplaySimulator())
    assert replay - replay_free > 0
    assert replay - replay_free == pytest.approx(analytical - analytical_free, rel=0.25)
    _, shared = _exposed_dp(PLAN, simulator=ReplaySimulator(dp_stream="shared"))
    _, shared_free = _exposed_dp(PLAN, ["gpu.efficiency.overlap_slowdown=0"], ReplaySimulator(dp_stream="shared"))
    assert shared == pytest.approx(shared_free, rel=1e-12)  # ASTRA-sim's rules know no contention
