"""The replay backend: event simulation of the per-stage programs the traces are made of.

It runs exactly the programs ``stageopt generate`` writes (same schedule, same
dependencies, same collectives), one representative rank per stage, with the
hardware model's kernel times (the same per-kernel model as the analytical
backend) and hierarchical collective times (:mod:`stageopt.hardware.network`).
Cost does not grow with data-parallel size.
"""

from __future__ import annotations

from stageopt.hardware import Hardware
from stageopt.program import ProgramOptions, build_programs
from stageopt.program.durations import node_durations
from stageopt.sim.base import Estimate, Simulator, estimate_from_times
from stageopt.sim.stage_replay import replay_stages
from stageopt.workload import Workload


class ReplaySimulator(Simulator):
    """Event replay of the stage programs (symmetric: one rank per stage)."""

    name = "replay"

    def __init__(self, options: ProgramOptions | None = None) -> None:
        self.options = options

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        programs = build_programs(work, self.options)
        timings = replay_stages(programs, [node_durations(p, work, hw) for p in programs])
        slowest = max(timings, key=lambda t: t.finish_s)
        est = estimate_from_times(work, hw, self.name, slowest.finish_s, slowest.comm_only_s)
        e = slowest.exposed_s
        breakdown = {"compute": slowest.compute_s, "exposed_tp_comm": e["tp"], "exposed_cp_comm": e["cp"],
                     "exposed_ep_comm": e["ep"], "pipeline_p2p": e["p2p"], "pipeline_bubble": slowest.idle_s,
                     "exposed_dp_comm": e["dp"], "exposed_comm": slowest.comm_only_s}
        return Estimate(**{**est.__dict__, "time_breakdown_s": breakdown,
                           "details": {"stage_finish_s": [t.finish_s for t in timings]}})
