"""ZeRO-3 with prefetch: the backward's gathers and scatters can hide only under the backward's compute.

A forward with compute to spare cannot absorb a backward whose communication exceeds its compute (the
forward is over by then), and each pass waits for its first block's gather (the backward re-gathers the
block the forward released last), the backward also for its last block's scatter. Checked in closed form
on a hand-made tail, and end to end against the program's own collectives and compute.
"""

from __future__ import annotations

import numpy as np
import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.program import ProgramOptions, build_programs
from stageopt.program.durations import node_durations
from stageopt.program.nodes import COLL, COMP
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.analytical_tail import zero3_exposed
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload

NO_CONTENTION = ["gpu.efficiency.overlap_slowdown=0"]


def _tail(gathers: float, scatters: float, blocks: int) -> dict[str, np.ndarray]:
    """What :func:`stage_tail` reports for ZeRO-3: the forward's and the backward's gathers, the scatters."""
    return {"zero3": np.array([2 * gathers + scatters]), "zero3_fwd": np.array([gathers]),
            "zero3_first": np.array([gathers / blocks]), "zero3_last": np.array([scatters / blocks])}


def test_a_backward_bound_pass_exposes_its_excess_whatever_the_forward_spares():
    hw = hardware_for("h100-sxm", NO_CONTENTION)
    # 10 blocks; gathers 2 s a pass, scatters 4 s (fp32); forward computes 8 s, backward 4 s
    got = zero3_exposed(hw, _tail(2.0, 4.0, 10), (np.array([8.0]), np.array([4.0])), np.array([True]))[0]
    forward = 0.2  # its first gather only: 2 s of gathers hide under 8 s of compute
    ends = 0.2 + 0.4  # the backward's first gather and its last scatter
    backward = ends + (2.0 + 4.0 - ends - 4.0)  # 6 s of communication against 4 s of compute
    assert got == pytest.approx(forward + backward)
    # the whole micro-batch would have hidden all but the first gather: 8 s of comm under 12 s of compute
    assert got > 2.0


def test_a_communication_bound_step_hides_only_its_compute_and_nothing_without_overlap():
    hw = hardware_for("h100-sxm", NO_CONTENTION)
    tail, compute = _tail(3.0, 6.0, 2), (np.array([0.1]), np.array([0.1]))
    # communication-bound: all 12 s of it but the 0.2 s the two passes' compute hides
    assert zero3_exposed(hw, tail, compute, np.array([True]))[0] == pytest.approx(12.0 - 0.2)
    assert zero3_exposed(hw, tail, (np.array([0.0]), np.array([0.0])), np.array([True]))[0] == pytest.approx(12.0)
    assert zero3_exposed(hw, _tail(1.0, 1.0, 4), compute, np.array([False]))[0] == pytest.approx(3.0)


def test_simulated_exposure_covers_the_programs_backward_excess():
    """gpt3-175b (4 layers) on 16 A100s, fp32 gradients over a thin network: the backward's collectives
    outlast its compute while the forward's do not; the exposed time is at least the backward's excess,
    taken from the program's own nodes and kernel times."""
    model = load_model("gpt3-175b", ["layers=4", "seq=2048"])
    plan = Plan.parse("tp=1 pp=1 dp=16 mbs=1 gbs=16 zero=3 recompute=none dtype=bf16 grad_dtype=fp32 "
                      "framework=megatron-deepspeed")
    work = build_workload(model, plan, 16)
    hw = hardware_for("a100-80g", [*NO_CONTENTION, "scaleout.bandwidth_gbps=16"])
    program = build_programs(work, ProgramOptions())[0]
    times = node_durations(program, work, hw)
    compute = {p: sum(times[n.id] for n in program.nodes if n.type == COMP and n.phase == p) for p in ("fwd", "bwd")}
    zero3 = [n for n in program.nodes if n.type == COLL and n.phase == "zero3"]
    gathers = sum(times[n.id] for n in zero3 if "gather" in n.name)
    scatters = sum(times[n.id] for n in zero3 if "scatter" in n.name)
    forward_comm, backward_comm = gathers / 2, gathers / 2 + scatters
    assert forward_comm < compute["fwd"] and backward_comm > compute["bwd"]
    exposed = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"]
    assert exposed >= backward_comm - compute["bwd"]
    assert exposed < gathers + scatters - compute["fwd"]  # the forward hides its own gathers but the first
