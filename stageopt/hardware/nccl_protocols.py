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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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

    def __post_init__(self) -> None:
        check_fields(self)

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
    net_step_one_per_node_us: float  # the tree's network hop latency, charged when ppn = 1
    bandwidth_share: float
    overhead_factor: float  # multiple of the host's post overhead an NVLink hop of a spanning ring costs at least
    capped: bool = False  # LL: bandwidth also capped by NcclTuning.ll_cap
    spanning_all_reduce_factor: float = 1.0  # latency multiple of a multi-node ring all-reduce (Simple's plateau)


RING_PROTOCOLS: tuple[RingProtocol, ...] = (
    RingProtocol("LL", 6.6, 0.6, 2.7, 5.0, 0.5, 1.0, capped=True),
    RingProtocol("LL128", 14.0, 1.9, 4.0, 8.5, 0.92, 1.0),
    RingProtocol("Simple", 8.4, 3.4, 14.0, 14.0, 1.0, 3.0, spanning_all_reduce_factor=1.4),  # compute cap. >= 8.0
)


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
    spanning = nodes > 1
    best = None
    for proto in RING_PROTOCOLS:
        nvlink = np.where(spanning, np.maximum(proto.nvlink_step_us, tuning.net_overhead_us * proto.overhead_factor),
                          proto.nvlink_step_us)
        net = np.where(per_node <= 1, proto.net_step_one_per_node_us, proto.net_step_us)
        latency = proto.base_us + (steps - inter) * nvlink + inter * net
        if kind == "all_reduce":
            latency = np.where(spanning, latency * proto.spanning_all_reduce_factor, latency)
        bandwidth = np.asarray(bus_gbps, dtype=float) * proto.bandwidth_share
        if proto.capped:
            bandwidth = np.minimum(bandwidth, tuning.ll_cap(nodes))
        t = latency * 1e-6 + factor * size / (bandwidth * 1e9)
        best = t if best is None else np.minimum(best, t)
    return np.where(many, best, 0.0)
