"""The replay backend: event simulation of the per-stage programs the traces are made of.

It runs exactly the programs ``stageopt generate`` writes (same schedule, same
dependencies, same collectives), one representative rank per stage, with the
hardware model's kernel times (the same per-kernel model as the analytical
backend) and hierarchical collective times (:mod:`stageopt.hardware.network`).
Cost does not grow with data-parallel size.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware import Hardware
from stageopt.hardware.kernels import KERNEL_CODES, kernel_seconds
from stageopt.hardware.network import collective_time, flat_scaleout_time, p2p_time
from stageopt.parallel.ranks import group_stride
from stageopt.program import ProgramOptions, StageProgram, build_programs
from stageopt.program.nodes import COLL, COMP, SEND
from stageopt.sim.base import Estimate, Simulator, estimate_from_times
from stageopt.sim.stage_replay import replay_stages
from stageopt.workload import Workload


def node_durations(program: StageProgram, work: Workload, hw: Hardware) -> np.ndarray:
    """Busy time of every node of a stage program, in seconds."""
    plan = work.plan
    nodes = program.nodes
    out = np.zeros(len(nodes))
    comp = [n for n in nodes if n.type == COMP]
    if comp:
        idx = np.array([n.id for n in comp])
        out[idx] = kernel_seconds(
            hw, plan.dtype, np.array([KERNEL_CODES[n.kernel] for n in comp]),
            np.array([n.num_ops for n in comp], dtype=float), np.array([n.tensor_size for n in comp], dtype=float),
            np.array([n.phase == "bwd" for n in comp]))
    by_kind: dict[tuple[str, str, int], list] = {}
    for n in nodes:
        if n.type == COLL:
            by_kind.setdefault((n.collective, n.group, n.group_size), []).append(n)
    for (collective, group, size), members in by_kind.items():
        idx = np.array([n.id for n in members])
        sizes = np.array([n.comm_size for n in members], dtype=float) * (size if collective == "all_gather" else 1)
        out[idx] = collective_time(hw, collective, sizes, size, group_stride(plan, group))
    for n in nodes:
        if n.type == COLL and n.phase == "zero3":
            size = n.comm_size * n.group_size if n.collective == "all_gather" else n.comm_size
            out[n.id] = flat_scaleout_time(hw, n.collective, size, n.group_size)
    sends = [n for n in nodes if n.type == SEND]
    if sends:
        idx = np.array([n.id for n in sends])
        out[idx] = p2p_time(hw, np.array([n.comm_size for n in sends], dtype=float), group_stride(plan, "pp"))
    return out


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
