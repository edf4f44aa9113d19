"""Collective timing as ASTRA-sim's system layer models it (pure functions).

Shared by the event replay (which drives the per-message state machines in
:mod:`stageopt.astrasim.events` with these numbers) and by closed-form models that
need the same answers without simulating messages.

How ASTRA-sim (commit 518bd51, analytical congestion-unaware backend) times a
collective of ``size`` bytes:

* It is cut into chunks of ``size // preferred-dataset-splits`` bytes (for
  all-gather ``size`` is the per-rank input). For the other types a chunk is at
  least ``total_nodes`` bytes, and then the size is raised to splits x chunk.
* Each chunk walks a list of *phases*, one per network dimension of more than
  one rank: dimension order for reduce-scatter and all-to-all, reversed for
  all-gather. With ``localBWAware`` an all-reduce becomes reduce-scatter on
  every dimension but the last, all-reduce on the last, then all-gather back
  down. A communicator group smaller than all ranks is one ring over its
  members (in file order), with a fixed 10 ns endpoint delay.
* Each dimension has one queue; at most ``active-chunks-per-dimension`` chunks
  run a phase in it at once; waiting chunks are ordered by priority (LIFO: a
  newer collective first).
* Inside a phase every packet passes an endpoint delay ``E`` (``endpoint-delay``
  ns; 10 ns for sub-group rings) and, when it carries data to reduce, a
  reduction time ``P = 3 * floor(msg / local_mem_bw)`` (one write, two reads).
  A message costs ``floor(hops x latency + msg / bandwidth)`` with bandwidth in
  GiB/s; a Switch counts 2 hops, FullyConnected 1, a bidirectional Ring the
  shorter way round; in a multi-dimensional network the first dimension in
  which the two ranks' coordinates differ carries the message.
* A ring phase sends one message per step, each after the previous one
  arrived: ``E + S x (d + E) + R x P`` for ``S`` steps of which ``R`` reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

from stageopt.astrasim.configs import AlgoSpec, CollectiveAlgo, NetworkConfig, SystemConfig, Topology
from stageopt.chakra import CommType
from stageopt.errors import ConfigError

GIB = 1 << 30
SUBGROUP_ENDPOINT_DELAY_NS = 10  # MemBus "Fast" transmission used by Local rings
SIMULATED_TYPES = (CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.ALL_TO_ALL)


class Direction(IntEnum):
    """Ring direction of a phase: the next member (clockwise) or the previous one."""

    CLOCKWISE = 0
    ANTICLOCKWISE = 1


@dataclass(frozen=True, slots=True)
class Link:
    """Congestion-unaware cost of one rank pair: fixed latency plus bytes per ns."""

    latency_ns: float
    bytes_per_ns: float


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """One phase of one chunk: which collective, on which dimension/queue, how much data."""

    comm_type: CommType
    dim: int
    direction: Direction
    data_size: int
    final_size: int
    algo: AlgoSpec


def bytes_per_ns(bandwidth_gbps: float) -> float:
    """GB/s (1 GB = 2^30 B) to bytes per ns, in the analytical backend's operation order."""
    return bandwidth_gbps * GIB / 1_000_000_000


def rank_address(net: NetworkConfig, rank: int) -> tuple[int, ...]:
    """Per-dimension coordinates of a rank; dimension 0 varies fastest."""
    out = []
    for n in net.npus_count:
        out.append(rank % n)
        rank //= n
    return tuple(out)


def hops(topology: Topology, npus: int, src: int, dst: int) -> int:
    """Hop count inside one dimension (Switch 2, FullyConnected 1, Ring shortest way)."""
    if topology is Topology.SWITCH:
        return 2
    if topology is Topology.FULLY_CONNECTED:
        return 1
    clockwise = (dst - src) % npus
    return min(clockwise, npus - clockwise)


def pair_link(net: NetworkConfig, src: int, dst: int) -> Link:
    """The dimension that carries src -> dst and its latency/bandwidth."""
    if src == dst:
        raise ConfigError(f"a message from rank {src} to itself cannot be timed; check comm_src/comm_dst")
    a, b = rank_address(net, src), rank_address(net, dst)
    for dim, (x, y) in enumerate(zip(a, b)):
        if x != y:
            h = hops(net.topology[dim], net.npus_count[dim], x, y)
            return Link(h * net.latency_ns[dim], bytes_per_ns(net.bandwidth_gbps[dim]))
    raise ConfigError(f"ranks {src} and {dst} have the same network address")  # pragma: no cover


def message_delay_ns(link: Link, size: int) -> int:
    """``floor(hops x latency + size / bandwidth)`` for one message."""
    return int(link.latency_ns + size / link.bytes_per_ns)


def reduction_delay_ns(size: int, local_mem_bw_gbps: float) -> int:
    """Time to reduce a received message: one write and two reads at local memory bandwidth (0: free)."""
    if local_mem_bw_gbps <= 0:
        return 0
    one = int(size / (local_mem_bw_gbps * 1e9) * 1e9)
    return 3 * one


def chunking(size: int, comm_type: CommType, splits: int, total_nodes: int) -> tuple[int, int]:
    """(chunk bytes, number of chunks) as ``Sys::generate_collective`` cuts a collective.

    Every chunk has the same size: the last one is not trimmed.
    """
    chunk = size // splits
    if comm_type != CommType.ALL_GATHER and total_nodes > chunk:
        chunk = total_nodes
        size = splits * chunk
    if chunk == 0:
        raise ConfigError(
            f"an all-gather of {size} bytes is smaller than preferred-dataset-splits={splits}; "
            "ASTRA-sim would loop forever on it — make comm_size >= the number of splits"
        )
    return chunk, math.ceil(size / chunk)


def phase_sizes(comm_type: CommType, algo: AlgoSpec, nodes: int, data_size: int) -> tuple[int, int]:
    """(message bytes of the first step, data bytes after the phase) for one phase."""
    if algo.algo is CollectiveAlgo.HALVING_DOUBLING:
        if comm_type == CommType.ALL_GATHER:
            return data_size, data_size * nodes
        if comm_type == CommType.REDUCE_SCATTER:
            return data_size // 2, data_size // nodes
        if comm_type == CommType.ALL_REDUCE:
            return data_size // 2, data_size
        raise ConfigError("halvingDoubling does not implement all-to-all; use 'ring' or 'direct' for all-to-all-implementation")
    if comm_type == CommType.ALL_GATHER:
        return data_size, data_size * nodes
    if comm_type == CommType.REDUCE_SCATTER:
        return data_size // nodes, data_size // nodes
    return data_size // nodes, data_size  # all-reduce, all-to-all


def plan_phases(
    comm_type: CommType,
    chunk_size: int,
    dim_nodes: tuple[int, ...],
    algos: tuple[AlgoSpec, ...],
    involved: tuple[bool, ...],
    local_bw_aware: bool,
) -> list[PhaseSpec]:
    """The phases one chunk walks through (empty: nothing to do, ASTRA-sim never finishes it).

    ``dim_nodes[d]`` ranks take part along logical dimension ``d``; one queue per
    dimension (ASTRA-sim's default ``--num-queues-per-dim=1``), so the first-half
    phases run clockwise and the all-gather half of an all-reduce anticlockwise.
    """
    ndims = len(dim_nodes)
    order = list(range(ndims))
    if comm_type == CommType.ALL_GATHER:
        order.reverse()
    active = [d for d in order if dim_nodes[d] > 1 and d < len(involved) and involved[d]]
    steps: list[tuple[CommType, int, Direction]] = []
    if comm_type != CommType.ALL_REDUCE or not local_bw_aware:
        steps = [(comm_type, d, Direction.CLOCKWISE) for d in active]
    elif active:
        *lower, last = active
        steps = [(CommType.REDUCE_SCATTER, d, Direction.CLOCKWISE) for d in lower]
        steps.append((CommType.ALL_REDUCE, last, Direction.CLOCKWISE))
        steps += [(CommType.ALL_GATHER, d, Direction.ANTICLOCKWISE) for d in reversed(lower)]
    phases = []
    size = chunk_size
    for ctype, dim, direction in steps:
        _, final = phase_sizes(ctype, algos[dim], dim_nodes[dim], size)
        phases.append(PhaseSpec(ctype, dim, direction, size, final, algos[dim]))
        size = final
    return phases


def ring_steps(comm_type: CommType, nodes: int) -> tuple[int, int]:
    """(messages sent, messages that need a reduction) by one rank in a ring phase."""
    if comm_type == CommType.ALL_REDUCE:
        return 2 * (nodes - 1), nodes - 1
    if comm_type == CommType.ALL_TO_ALL:
        return nodes * (nodes - 1) // 2, 0
    if comm_type == CommType.REDUCE_SCATTER:
        return nodes - 1, nodes - 1
    return nodes - 1, 0


def ring_phase_ns(comm_type: CommType, nodes: int, data_size: int, link: Link, endpoint_ns: int,
                  local_mem_bw_gbps: float) -> int:
    """Closed form of one ring phase when all members start together on a uniform ring.

    ``E + S x (d + E) + R x P``: one endpoint delay to start, then every step a
    message (``d``) and an endpoint delay, plus a reduction for ``R`` of them.
    """
    msg, _ = phase_sizes(comm_type, AlgoSpec(CollectiveAlgo.RING), nodes, data_size)
    sends, reduced = ring_steps(comm_type, nodes)
    d = message_delay_ns(link, msg)
    return endpoint_ns + sends * (d + endpoint_ns) + reduced * reduction_delay_ns(msg, local_mem_bw_gbps)


def pipelined_chunks_ns(phase_ns: list[int], chunks: int, active_per_queue: int, queue_of: list[int]) -> int:
    """Finish time of ``chunks`` identical chunks through per-dimension queues.

    Each phase runs in its dimension's queue with at most ``active_per_queue``
    chunks at a time, chunks taking slots in order; the symmetric-case model of
    ASTRA-sim's stream scheduler for one collective alone on a rank.
    """
    free_at: dict[int, list[int]] = {q: [0] * active_per_queue for q in set(queue_of)}
    ready = [0] * chunks
    for p, dur in enumerate(phase_ns):
        slots = free_at[queue_of[p]]
        for c in range(chunks):
            i = min(range(active_per_queue), key=slots.__getitem__)
            start = max(ready[c], slots[i])
            ready[c] = slots[i] = start + dur
    return max(ready) if ready else 0


def symmetric_ring_collective_ns(comm_type: CommType, size: int, system: SystemConfig, net: NetworkConfig) -> int:
    """Closed-form time of one collective over all ranks when every dimension uses ring.

    Valid when each dimension's ring links are uniform (Switch, FullyConnected,
    or Ring) and all ranks start together, which is the case for a lone
    collective; the event replay reproduces it message by message.
    """
    total = net.num_npus
    algos = algos_for(comm_type, system)
    dims = tuple(net.npus_count[: len(algos)])
    chunk, count = chunking(size, comm_type, system.preferred_dataset_splits, total)
    phases = plan_phases(comm_type, chunk, dims, algos, (True,) * len(dims), system.local_bw_aware)
    durations = []
    for ph in phases:
        if ph.algo.algo is not CollectiveAlgo.RING:
            raise ConfigError("symmetric_ring_collective_ns covers ring implementations only")
        nodes = dims[ph.dim]
        link = Link(hops(net.topology[ph.dim], nodes, 0, 1) * net.latency_ns[ph.dim], bytes_per_ns(net.bandwidth_gbps[ph.dim]))
        durations.append(ring_phase_ns(ph.comm_type, nodes, ph.data_size, link, system.endpoint_delay_ns,
                                       system.local_mem_bw_gbps))
    return pipelined_chunks_ns(durations, count, system.active_chunks_per_dimension, [ph.dim for ph in phases])


def algos_for(comm_type: CommType, system: SystemConfig) -> tuple[AlgoSpec, ...]:
    """The per-dimension implementation list the system file gives for a collective type."""
    if comm_type == CommType.ALL_REDUCE:
        return system.all_reduce
    if comm_type == CommType.ALL_GATHER:
        return system.all_gather
    if comm_type == CommType.REDUCE_SCATTER:
        return system.reduce_scatter
    if comm_type == CommType.ALL_TO_ALL:
        return system.all_to_all
    raise ConfigError(f"collective type {CommType(comm_type).name} is not simulated; ASTRA-sim aborts on it")

