"""NCCL's three ring protocols, and the one NCCL picks for a message (vectorized).

Why: one per-step latency and one bandwidth cannot fit a collective across
sizes. NCCL moves small messages with LL (8-byte stores with an inline flag:
cheap per step, half the bandwidth, capped), middle ones with LL128 and large
ones with Simple (full bandwidth, a few microseconds a step), choosing per call
the protocol its own cost model says is fastest. stageopt uses that model:
the constants below are NCCL's (``src/graph/tuning.cc`` at NVIDIA/nccl
5067397c: ``baseLatencies``, ``hwLatencies``, the LL and LL128 bandwidth
refinements and the ring all-reduce plateau); the machine's share of them
(LL's bandwidth cap, the host's network post overhead) is
:class:`NcclTuning`, a hardware field.

With the presets' Simple bus bandwidth this reproduces the published nccl-tests
curve of a DGX H100 from 8 B to 32 MiB (``experiments/validation/nccl_tests.py``);
the flat α-β ring it replaced was 26% fast over 64 KiB - 64 MiB.

Ring, for ``n`` ranks over ``N`` nodes (``N = 1`` inside one NVLink domain),
``steps`` = 2(n-1) for all-reduce and n-1 for all-gather / reduce-scatter, of
which ``inter`` = 2(N-1) or N-1 cross the network; per protocol p:

    time_p = base_p + (steps - inter)·nvlink_p + inter·net_p + factor·S / bw_p

where an NVLink hop of a spanning ring costs at least the host's post overhead
(three times it under Simple), ``net_p`` is the tree's network latency when
each node holds one rank (NCCL: "with ppn=1 latencies are fully exposed"),
Simple's multi-node all-reduce latency is 1.4x (the ring's plateau), and
``bw_p`` is the Simple bus bandwidth x 0.5 (LL, at most its cap) or x 0.92
(LL128). The time is the smallest of the three.

Those are the constants of NCCL 2.23 and later. Older releases priced rings
differently (:data:`NCCL_RELEASES`, each from ``tuning.cc`` at its tag), and a
2021 run on NCCL 2.9 chose protocols by the older table: the framework
profile's ``nccl_release`` names the release its stack shipped with.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from stageopt.frameworks.profile import nccl_version
from stageopt.inputs.schema import bounds, check_fields


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclTuning:
    """The machine's inputs to NCCL's protocol choice (``llMaxBws``, ``getNetOverhead`` in tuning.cc).

    LL's bus bandwidth is capped by what its flag-polling loads sustain: on one
    node by the GPU generation (Ampere 87.7, Hopper 141, Blackwell 282 GB/s), across
    nodes by the host CPU (Intel or Arm hosts 39.0 on two nodes and 20.4 on more;
    AMD 22.5 and 19.0). The network post overhead is 1 us on Intel and Arm hosts,
    2 us on AMD.
    """

    ll_max_gbps: float = field(metadata=bounds(gt=0, doc="LL bus-bandwidth cap inside one node"))
    ll_max_gbps_two_nodes: float = field(metadata=bounds(gt=0, doc="LL cap over two nodes"))
    ll_max_gbps_many_nodes: float = field(metadata=bounds(gt=0, doc="LL cap over more than two nodes"))
    net_overhead_us: float = field(default=1.0, metadata=bounds(ge=0, doc="host post overhead per ring step"))
    release: str = field(default="2.23", metadata={"doc": "NCCL release whose cost model prices rings (a framework "
                                                           "profile's nccl_release sets it)"})

    def __post_init__(self) -> None:
        check_fields(self)
        release_protocols(self.release)  # one-line error for a release NCCL never had

    def ll_cap(self, nodes):
        """LL's bus-bandwidth cap for a ring over ``nodes`` nodes."""
        nodes = np.asarray(nodes, dtype=float)
        return np.where(nodes <= 1, self.ll_max_gbps,
                        np.where(nodes <= 2, self.ll_max_gbps_two_nodes, self.ll_max_gbps_many_nodes))


@dataclass(frozen=True, slots=True)
class RingProtocol:
    """One protocol's ring constants in NCCL's cost model (microseconds; share of the Simple bandwidth)."""

    name: str
    base_us: float
    nvlink_step_us: float
    net_step_us: float
    net_step_one_per_node_us: float  # the network hop when each node holds one rank (2.23+: the tree's)
    bandwidth_share: float
    overhead_factor: float  # multiple of the host's post overhead an NVLink hop of a spanning ring costs at least
    capped: bool = False  # LL: bandwidth also capped by NcclTuning.ll_cap
    spanning_all_reduce_factor: float = 1.0  # latency multiple of a multi-node ring all-reduce (Simple's plateau)
    one_node_gather_share: float | None = None  # bandwidth share of a one-node all-gather / reduce-scatter
    one_per_node_share: float | None = None  # bandwidth share when each node holds one rank
    spanning_nvlink_factor: float = 1.0  # NVLink hops of a spanning ring cost this multiple
    plateau_bytes_per_rank: float = 0.0  # the plateau applies from this many bytes per rank


_LL = RingProtocol("LL", 6.6, 0.6, 2.7, 5.0, 0.5, 1.0, capped=True)
_LL128 = RingProtocol("LL128", 14.0, 1.9, 4.0, 8.5, 0.92, 1.0)
_SIMPLE = RingProtocol("Simple", 8.4, 3.4, 14.0, 14.0, 1.0, 3.0, spanning_all_reduce_factor=1.4)  # compute cap. >= 8
RING_PROTOCOLS: tuple[RingProtocol, ...] = (_LL, _LL128, _SIMPLE)


def with_changes(protocols, **changes_by_name):
    """An older release's table: ``protocols`` with the named protocols' fields changed."""
    return tuple(replace(p, **changes_by_name.get(p.name, {})) for p in protocols)


# 2.21-2.22: one rank per node pays the ring's own network hop, and LL128 keeps 0.7 of the bandwidth there
_R2_21 = with_changes(RING_PROTOCOLS, LL={"net_step_one_per_node_us": 2.7},
                      LL128={"net_step_one_per_node_us": 4.0, "one_per_node_share": 0.7})
# 2.18-2.20: LL at a quarter of the bandwidth (a third on a one-node all-gather or reduce-scatter)
_R2_18 = with_changes(_R2_21, LL={"bandwidth_share": 0.25, "one_node_gather_share": 1 / 3})
# 2.8-2.11 and 2.14-2.17: cheaper LL and LL128 bases and LL NVLink hops (1.8x on a spanning ring), a 9.6 us
# network hop under Simple, no host post overhead, and a 1.9x plateau from 4 KiB per rank
_R2_8 = with_changes(_R2_18, LL={"base_us": 3.6, "nvlink_step_us": 0.47, "overhead_factor": 0.0,
                                 "spanning_nvlink_factor": 1.8},
                     LL128={"base_us": 10.0, "overhead_factor": 0.0},
                     Simple={"net_step_us": 9.6, "net_step_one_per_node_us": 9.6, "overhead_factor": 0.0,
                             "spanning_all_reduce_factor": 1.9, "plateau_bytes_per_rank": 4096.0})
# 2.12-2.13: a 28 us network hop under Simple
_R2_12 = with_changes(_R2_8, Simple={"net_step_us": 28.0, "net_step_one_per_node_us": 28.0})

# Each table holds from its release up to the next (tuning.cc at v2.8.4-1, v2.12.12-1, v2.14.3-1, v2.18.3-1,
# v2.21.5-1 and v2.23.4-1, which 5067397c still matches for rings).
NCCL_RELEASES: tuple[tuple[str, tuple[RingProtocol, ...]], ...] = (
    ("2.8", _R2_8), ("2.12", _R2_12), ("2.14", _R2_8), ("2.18", _R2_18), ("2.21", _R2_21), ("2.23", RING_PROTOCOLS))


def table_for(release: str, releases):
    """The table of ``releases`` ((first release, table), oldest first) in force at ``release`` (``2.18.3``)."""
    version = nccl_version(release)
    return [table for start, table in releases if nccl_version(start) <= version][-1]


def release_protocols(release: str) -> tuple[RingProtocol, ...]:
    """The ring protocol table of an NCCL release (``2.10``, ``2.18.3``, ...)."""
    return table_for(release, NCCL_RELEASES)


def ring_protocol_time(tuning: NcclTuning, kind: str, size, n, nodes, bus_gbps, per_node=None):
    """Seconds for a ring all-reduce, all-gather or reduce-scatter of ``size`` bytes (the whole buffer) over
    ``n`` ranks on ``nodes`` nodes (``per_node`` ranks each, default ``n / nodes``) whose Simple protocol
    reaches ``bus_gbps`` of bus bandwidth, under the fastest protocol."""
    size, n = np.asarray(size, dtype=float), np.asarray(n, dtype=float)
    nodes = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    per_node = n / nodes if per_node is None else np.asarray(per_node, dtype=float)
    phases = 2.0 if kind == "all_reduce" else 1.0
    many = n > 1
    steps = phases * np.maximum(n - 1, 0.0)
    inter = np.where(nodes > 1, phases * (nodes - 1), 0.0)
    factor = np.where(many, steps / np.maximum(n, 1.0), 0.0)
    best = None
    for proto in release_protocols(tuning.release):
        t = _protocol_time(proto, tuning, kind, size, n, (steps, inter, factor), nodes, per_node, bus_gbps)
        best = t if best is None else np.minimum(best, t)
    return np.where(many, best, 0.0)


def _protocol_time(proto: RingProtocol, tuning: NcclTuning, kind, size, n, ring, nodes, per_node, bus_gbps):
    """Seconds for one ring collective under ``proto``; ``ring`` is (steps, network steps, bandwidth factor)."""
    steps, inter, factor = ring
    spanning = nodes > 1
    hop = proto.nvlink_step_us * np.where(spanning, proto.spanning_nvlink_factor, 1.0)
    nvlink = np.where(spanning, np.maximum(hop, tuning.net_overhead_us * proto.overhead_factor), hop)
    net = np.where(per_node <= 1, proto.net_step_one_per_node_us, proto.net_step_us)
    latency = proto.base_us + (steps - inter) * nvlink + inter * net
    if kind == "all_reduce":
        plateau = spanning & (size >= proto.plateau_bytes_per_rank * n)
        latency = np.where(plateau, latency * proto.spanning_all_reduce_factor, latency)
    share = np.full(np.shape(spanning), proto.bandwidth_share)
    if proto.one_node_gather_share is not None and kind != "all_reduce":
        share = np.where(spanning, share, proto.one_node_gather_share)
    if proto.one_per_node_share is not None:
        share = np.where(per_node < 2, proto.one_per_node_share, share)
    bandwidth = np.asarray(bus_gbps, dtype=float) * share
    if proto.capped:
        bandwidth = np.minimum(bandwidth, tuning.ll_cap(nodes))
    return latency * 1e-6 + factor * size / (bandwidth * 1e9)
