"""The replay backend: event simulation of the per-stage programs the traces are made of.

It runs exactly the programs ``stageopt generate`` writes (same schedule, same
dependencies, same collectives), one representative rank per stage, with the
hardware model's kernel times (the same per-kernel model as the analytical
backend) and hierarchical collective times (:mod:`stageopt.hardware.network`).
Cost does not grow with data-parallel size.

``dp_stream``: ``background`` (the default) runs data-parallel gradient
collectives on their own stream, as Megatron-LM does; ``shared`` puts them on
the one communication slot, ASTRA-sim's rule, which is how the replay
reproduces ``--backend astra-sim``. With ``background``, kernels that run
under a combined-1F1B pair's expert all-to-alls (``ep_overlap``) or beside a
data-parallel collective slow down as the analytical model charges
(:mod:`stageopt.sim.stage_replay`), and the backward TP collectives the stack
issues beside a GEMM take what the GEMM leaves exposed; ASTRA-sim prices no
such contention and runs every collective whole, and so does ``shared``.
ASTRA-sim's analytical network also times every collective as one
latency-bandwidth ring per tier, not with NCCL's protocol and algorithm choice
(:mod:`stageopt.hardware.nccl_protocols`, :mod:`stageopt.hardware.nccl_tree`); ``shared`` prices them so too.
"""

from __future__ import annotations

import dataclasses

from stageopt.errors import ConfigError
from stageopt.hardware import Hardware
from stageopt.program import ProgramOptions, build_programs
from stageopt.program.durations import node_durations
from stageopt.sim.analytical_schedules import overlaps_iterations
from stageopt.sim.backend_notes import POST_VALIDATION
from stageopt.sim.base import Estimate, Simulator, estimate_from_times
from stageopt.sim.stage_replay import BACKGROUND_PHASES, replay_stages
from stageopt.workload import Workload

DP_STREAMS = ("background", "shared")


class ReplaySimulator(Simulator):
    """Event replay of the stage programs (symmetric: one rank per stage)."""

    name = "replay"

    def __init__(self, options: ProgramOptions | None = None, dp_stream: str = "background") -> None:
        if dp_stream not in DP_STREAMS:
            raise ConfigError(f"dp_stream {dp_stream!r} is unknown; use one of {', '.join(DP_STREAMS)}")
        self.options = options
        self.dp_stream = dp_stream

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        programs = build_programs(work, self.options)
        if self.dp_stream == "shared":
            hw = dataclasses.replace(hw, nccl=None)  # ASTRA-sim's network: one α-β ring per tier
        background = BACKGROUND_PHASES if self.dp_stream == "background" else ()
        # ASTRA-sim's rules (shared) know no contention; Megatron's combined 1F1B pays it (ep_overlap), and
        # every kernel beside a background data-parallel collective does
        own_stream = self.dp_stream == "background"
        eff = hw.gpu.efficiency
        a2a_rate = eff.a2a_overlap_saving if work.plan.ep_overlap and own_stream else 1.0
        dp_rate = eff.overlapped_rate if own_stream else 1.0
        durations = [node_durations(p, work, hw, tp_async=own_stream) for p in programs]
        timings = replay_stages(programs, durations, background, a2a_rate, dp_rate)
        slowest = max(timings, key=lambda t: t.finish_s)
        e = slowest.exposed_s
        comm = slowest.comm_only_s - e["offload"]
        flushes = work.plan.flushes  # the programs hold one flush; a step runs them back to back
        est = estimate_from_times(work, hw, self.name, flushes * slowest.finish_s, flushes * comm)
        breakdown = {"compute": slowest.compute_s, "exposed_tp_comm": e["tp"], "exposed_cp_comm": e["cp"],
                     "exposed_ep_comm": e["ep"], "pipeline_p2p": e["p2p"], "pipeline_bubble": slowest.idle_s,
                     "exposed_dp_comm": e["dp"], "activation_offload": e["offload"], "exposed_comm": comm}
        breakdown = {k: flushes * v for k, v in breakdown.items()}
        details = {"stage_finish_s": [t.finish_s for t in timings], "dp_stream": self.dp_stream}
        if overlaps_iterations(work.plan):
            details["notes"] = [POST_VALIDATION]
        return Estimate(**{**est.__dict__, "time_breakdown_s": breakdown, "details": details})
