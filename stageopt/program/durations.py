"""How long each node of a stage program takes on a machine: kernels, collectives, messages.

Why here, below the simulators: the replay backend runs these durations, and
the trace writer puts the same numbers into each compute node's
``duration_micros`` for ASTRA-sim, so every backend times a node one way.
Kernels come from :mod:`stageopt.hardware.kernels`, collectives and sends from
:mod:`stageopt.hardware.network`.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware import Hardware
from stageopt.hardware.kernels import KERNEL_CODES, kernel_seconds
from stageopt.hardware.network import collective_time, flat_scaleout_time, p2p_time
from stageopt.parallel.ranks import group_stride
from stageopt.program.nodes import COLL, COMP, SEND, StageProgram
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
