"""Small programs whose replay time is derived by hand from ASTRA-sim's rules.

Each expected number is written out from the formulas (message delay
``floor(hops x latency + bytes / (GB/s x 2^30 / 1e9))``, endpoint delay per
packet, reduction ``3 x floor(bytes / local_mem_bw)``, two active chunks per
dimension), not computed by the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from stageopt.astrasim.configs import AlgoSpec, CollectiveAlgo, NetworkConfig, SchedulingPolicy, SystemConfig, Topology
from stageopt.astrasim.events import Op, OpKind, Slot
from stageopt.astrasim.trace_replay import replay_programs, roofline_ns
from stageopt.chakra import CommType
from stageopt.errors import ConfigError, SimulatorError

RING = (AlgoSpec(CollectiveAlgo.RING),)
SYSTEM = SystemConfig(
    scheduling_policy=SchedulingPolicy.LIFO, endpoint_delay_ns=10, active_chunks_per_dimension=2,
    preferred_dataset_splits=4, all_reduce=RING, all_gather=RING, reduce_scatter=RING, all_to_all=RING,
    local_bw_aware=True, local_mem_bw_gbps=1000.0, roofline_enabled=True, peak_perf_tflops=100.0, replay_only=False,
)


def _net(topology: Topology, npus: int, bw: float, lat: float) -> NetworkConfig:
    return NetworkConfig(topology=(topology,), npus_count=(npus,), bandwidth_gbps=(bw,), latency_ns=(lat,))


def _coll(comm_type: CommType, size: int, group: int = 0) -> Op:
    return Op(1, OpKind.COLLECTIVE, Slot.COMM, comm_type=comm_type, size=size, group=group)


def test_all_reduce_on_ring_of_8_matches_closed_form() -> None:
    net = _net(Topology.RING, 8, 100.0, 500.0)
    result = replay_programs([[_coll(CommType.ALL_REDUCE, 8 << 20)] for _ in range(8)], {}, SYSTEM, net)
    msg = (8 << 20) // 4 // 8                      # chunk of a quarter, split in 8 ring steps
    d = int(1 * 500.0 + msg / (100.0 * 2**30 / 1e9))  # one hop to the ring neighbour
    reduce = 3 * int(msg / 1000e9 * 1e9)
    phase = 10 + 14 * (d + 10) + 7 * reduce         # 2(n-1) steps, the first n-1 reduce
    assert d == 2941 and reduce == 786
    assert [r.cycles for r in result.ranks] == [2 * phase] * 8   # 4 chunks, 2 at a time
    assert all(r.exposed_comm_cycles == 2 * phase for r in result.ranks)


def test_roofline_compute_time_and_chain() -> None:
    compute_bound = roofline_ns(10**12, 10**6, SYSTEM)   # intensity 1e6 -> capped at 100 TFLOP/s
    memory_bound = roofline_ns(10**9, 10**9, SYSTEM)     # intensity 1 -> 1000 GB/s x 1 = 1 TFLOP/s
    assert compute_bound == 10_000_000 and memory_bound == 1_000_000
    prog = [Op(1, OpKind.COMPUTE, Slot.GPU, (), compute_bound, True),
            Op(2, OpKind.COMPUTE, Slot.GPU, (1,), memory_bound, True)]
    result = replay_programs([prog, []], {}, SYSTEM, _net(Topology.SWITCH, 2, 50.0, 1000.0))
    assert result.ranks[0].cycles == 11_000_000 and result.ranks[0].exposed_comm_cycles == 0
    assert result.ranks[1].cycles == 0


def test_gpu_slot_serialises_independent_compute_in_id_order() -> None:
    prog = [Op(5, OpKind.COMPUTE, Slot.GPU, (), 300, True), Op(2, OpKind.COMPUTE, Slot.GPU, (), 200, True),
            Op(9, OpKind.COMPUTE, Slot.CPU, (), 1000, False)]
    result = replay_programs([prog, []], {}, SYSTEM, _net(Topology.SWITCH, 2, 50.0, 1000.0))
    assert result.ranks[0].cycles == 1000          # CPU op runs beside the two GPU ops (500 ns)
    assert result.ranks[0].exposed_comm_cycles == 1000 - 500


def test_send_recv_pair() -> None:
    size = 1 << 20
    d = int(2 * 1000.0 + size / (50.0 * 2**30 / 1e9))   # a Switch counts two hops
    sender = [Op(1, OpKind.COMPUTE, Slot.GPU, (), 5000, True), Op(2, OpKind.SEND, Slot.COMM, (1,), size=size, peer=1, tag=7)]
    receiver = [Op(1, OpKind.RECV, Slot.NONE, (), size=size, peer=0, tag=7), Op(2, OpKind.COMPUTE, Slot.GPU, (), 100, True)]
    result = replay_programs([sender, receiver], {}, SYSTEM, _net(Topology.SWITCH, 2, 50.0, 1000.0))
    assert d == 21531
    assert result.ranks[0].cycles == 5000 + d and result.ranks[0].exposed_comm_cycles == d
    assert result.ranks[1].cycles == 5000 + d and result.ranks[1].exposed_comm_cycles == 5000 + d - 100


def test_late_receive_gets_an_arrived_message_at_once() -> None:
    size = 1 << 20
    sender = [Op(1, OpKind.SEND, Slot.COMM, (), size=size, peer=1, tag=3)]
    receiver = [Op(1, OpKind.COMPUTE, Slot.GPU, (), 40_000, True), Op(2, OpKind.RECV, Slot.NONE, (1,), size=size, peer=0, tag=3)]
    result = replay_programs([sender, receiver], {}, SYSTEM, _net(Topology.SWITCH, 2, 50.0, 1000.0))
    assert result.ranks[0].cycles == 21531 and result.ranks[1].cycles == 40_000


def test_subgroup_all_gather_is_a_ring_over_members_with_10ns_endpoint() -> None:
    net = NetworkConfig(topology=(Topology.RING, Topology.SWITCH), npus_count=(2, 4),
                        bandwidth_gbps=(200.0, 50.0), latency_ns=(500.0, 2000.0))
    system = dataclasses.replace(SYSTEM, endpoint_delay_ns=99)   # not used by sub-group rings
    programs = [[_coll(CommType.ALL_GATHER, 1 << 20, group=1)] if r in (0, 2) else [] for r in range(8)]
    result = replay_programs(programs, {1: [0, 2]}, system, net)
    msg = (1 << 20) // 4                            # per-rank chunk, sent whole in a 2-rank ring
    d = int(2 * 2000.0 + msg / (50.0 * 2**30 / 1e9))  # ranks 0 and 2 differ in dimension 1 (Switch)
    phase = 10 + 1 * (d + 10)
    assert [r.cycles for r in result.ranks] == [2 * phase, 0, 2 * phase, 0, 0, 0, 0, 0]


def test_direct_all_to_all_sends_to_every_peer_at_once() -> None:
    direct = (AlgoSpec(CollectiveAlgo.DIRECT),)
    system = dataclasses.replace(SYSTEM, all_to_all=direct)
    net = _net(Topology.SWITCH, 8, 400.0, 936.25)
    result = replay_programs([[_coll(CommType.ALL_TO_ALL, 1 << 20)] for _ in range(8)], {}, system, net)
    d = int(2 * 936.25 + (1 << 20) // 4 // 8 / (400.0 * 2**30 / 1e9))
    phase = 10 + d + 10                             # 7 packets leave together, 7 come back together
    assert result.max_cycles == 2 * phase


def test_collective_on_one_rank_group_never_finishes() -> None:
    programs = [[_coll(CommType.ALL_REDUCE, 1 << 20, group=9)] if r == 0 else [] for r in range(2)]
    with pytest.raises(SimulatorError, match="never finish"):
        replay_programs(programs, {9: [0]}, SYSTEM, _net(Topology.SWITCH, 2, 50.0, 1000.0))


def test_sends_are_eager_but_an_unmatched_receive_hangs() -> None:
    net = _net(Topology.SWITCH, 2, 50.0, 1000.0)
    lone_send = [[Op(1, OpKind.SEND, Slot.COMM, (), size=64, peer=1, tag=1)], []]
    assert replay_programs(lone_send, {}, SYSTEM, net).ranks[0].cycles == int(2000 + 64 / (50.0 * 2**30 / 1e9))
    lone_recv = [[], [Op(1, OpKind.RECV, Slot.NONE, (), size=64, peer=0, tag=1)]]
    with pytest.raises(SimulatorError, match=r"rank\(s\) \[1\]"):
        replay_programs(lone_recv, {}, SYSTEM, net)


def test_rank_count_must_match_network() -> None:
    with pytest.raises(ConfigError, match="8 NPUs"):
        replay_programs([[]] * 3, {}, SYSTEM, _net(Topology.SWITCH, 8, 50.0, 1000.0))


def test_missing_dependency_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="depends on node 42"):
        replay_programs([[Op(1, OpKind.COMPUTE, Slot.GPU, (42,), 5, True)], []], {}, SYSTEM,
                        _net(Topology.SWITCH, 2, 50.0, 1000.0))
