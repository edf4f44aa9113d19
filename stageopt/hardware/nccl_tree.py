"""NCCL's tree all-reduce across nodes, priced by NCCL's own cost model (vectorized).

Why: NCCL runs an all-reduce that spans nodes as a ring or as a double binary
tree, whichever its cost model says is faster. A ring's latency grows with the
ranks (2(n-1) steps), a tree's with the log of the nodes, so a small all-reduce
over hundreds of nodes takes microseconds on the tree where the ring would take
milliseconds. All-gather and reduce-scatter have no tree.

Per protocol p (LL, LL128, Simple), for ``n`` ranks on ``N`` nodes (``n/N`` a node):

    time_p = base_p + 2·((n/N - 1)·nvlink_p + floor(log2 N)·net_p) + S / (0.5 · bw_p · correction_p(S))

with ``bw_p`` the bus bandwidth x 0.92 (Simple), x 0.92 x 120/128 (LL128) or
x 0.92 / 3.8, at most LL's cap (LL), and ``correction_p`` NCCL's measured
shortfall of trees at medium sizes (``treeCorrectionFactor``, by powers of two
from 64 B). Constants from ``src/graph/tuning.cc`` at each tag where they
changed (:data:`TREE_RELEASES`). Left out: the per-channel tree bandwidth caps
(they need NCCL's channel count, which the presets do not state; where they bind,
LL128 trees run slower than priced here) and the 0.85 of a topology whose NICs
all hang off one GPU (not the NVIDIA presets' nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stageopt.hardware.nccl_protocols import NcclTuning, table_for, with_changes

_SHRINK = 0.92  # every tree all-reduce (tuning.cc: busBw * .92)
# treeCorrectionFactor (2.12 on), one row per protocol, bandwidth multiple at 64 B x 2^i for i = 0..22
_CORRECTION_LL = (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0)
_CORRECTION_LL128 = (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
                     1.0)
_CORRECTION_SIMPLE = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)


@dataclass(frozen=True, slots=True)
class TreeProtocol:
    """One protocol's tree constants in NCCL's cost model (microseconds; share of the bus bandwidth)."""

    name: str
    base_us: float
    nvlink_step_us: float
    net_step_us: float
    bandwidth_share: float
    correction: tuple[float, ...]
    capped: bool = False  # LL: bandwidth also capped by NcclTuning.ll_cap
    nvlink_factor: float = 1.0  # NVLink hops cost this multiple (LL before 2.18: 1.8)


TREE_PROTOCOLS: tuple[TreeProtocol, ...] = (
    TreeProtocol("LL", 6.8, 0.6, 5.0, _SHRINK / 3.8, _CORRECTION_LL, capped=True),
    TreeProtocol("LL128", 14.0, 1.25, 8.5, _SHRINK * 120 / 128, _CORRECTION_LL128),
    TreeProtocol("Simple", 8.4, 4.0, 14.0, _SHRINK, _CORRECTION_SIMPLE),
)


# 2.19-2.22: Simple's hops at 28 us on NVLink and the network, no Simple base
_T2_19 = with_changes(TREE_PROTOCOLS, Simple={"base_us": 0.0, "nvlink_step_us": 28.0, "net_step_us": 28.0})
# 2.18: Simple's hops at 4 and 14 us
_T2_18 = with_changes(_T2_19, Simple={"nvlink_step_us": 4.0, "net_step_us": 14.0})
# 2.12-2.17: bases of 4.4 us, LL NVLink hops of 0.52 us (1.8x on a tree across nodes), Simple's hops at 28 us
_T2_12 = with_changes(_T2_18, LL={"base_us": 4.4, "nvlink_step_us": 0.52, "nvlink_factor": 1.8},
                      LL128={"base_us": 4.4}, Simple={"nvlink_step_us": 28.0, "net_step_us": 28.0})
# 2.8-2.11: LL128 at 0.915 of the tree's bandwidth, and its own correction row
_T2_8 = with_changes(_T2_12, LL128={"bandwidth_share": _SHRINK * 0.915,
                                    "correction": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6,
                                                   .7, .7, .8, .9, .9, .92, .92)})

# tuning.cc at v2.8.4-1, v2.12.12-1, v2.18.3-1, v2.19.3-1 and v2.23.4-1 (which 5067397c still matches for trees)
TREE_RELEASES: tuple[tuple[str, tuple[TreeProtocol, ...]], ...] = (
    ("2.8", _T2_8), ("2.12", _T2_12), ("2.18", _T2_18), ("2.19", _T2_19), ("2.23", TREE_PROTOCOLS))


def tree_all_reduce_time(tuning: NcclTuning, size, per_node, nodes, bus_gbps):
    """Seconds for a tree all-reduce of ``size`` bytes over ``nodes`` nodes of ``per_node`` ranks, whose bus
    bandwidth is ``bus_gbps``, under the fastest protocol of the release in ``tuning``."""
    size = np.asarray(size, dtype=float)
    nodes = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    per_node = np.asarray(per_node, dtype=float)
    depth = np.floor(np.log2(nodes))
    index = np.floor(np.log2(np.maximum(np.floor(size / 64), 1.0))).astype(int)
    corrected = (size >= 64) & (index < 23)
    best = None
    for proto in table_for(tuning.release, TREE_RELEASES):
        nvlink = proto.nvlink_step_us * np.where(nodes > 1, proto.nvlink_factor, 1.0)
        latency = proto.base_us + 2 * ((per_node - 1) * nvlink + depth * proto.net_step_us)
        bandwidth = np.asarray(bus_gbps, dtype=float) * proto.bandwidth_share
        if proto.capped:
            bandwidth = np.minimum(bandwidth, tuning.ll_cap(nodes))
        correction = np.where(corrected, np.asarray(proto.correction)[np.clip(index, 0, 22)], 1.0)
        t = latency * 1e-6 + size / (0.5 * bandwidth * correction * 1e9)
        best = t if best is None else np.minimum(best, t)
    return best
