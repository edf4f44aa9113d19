"""NCCL's protocol choice for ring collectives, against NCCL's cost model worked by hand.

Each expected time is written out from the constants of NVIDIA/nccl src/graph/tuning.cc (ring: base latency
LL 6.6 / LL128 14 / Simple 8.4 us; NVLink hop 0.6 / 1.9 / 3.4 us; network hop 2.7 / 4.0 / 14 us, the tree's
5.0 / 8.5 / 14 us with one rank per node) and the preset's own bandwidths.
"""

from __future__ import annotations

import dataclasses

import pytest

from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time

H100 = load_hardware("h100-sxm")
A100 = load_hardware("a100-80g")


def _node_bus(hw) -> float:
    return hw.tiers[0].achieved_gbps * 1e9


def test_a_tiny_all_reduce_on_one_node_takes_ll_latency():
    # 8 ranks: 2 x 7 NVLink steps under LL, plus its base latency; 8 bytes move at LL's capped rate
    by_hand = (6.6 + 14 * 0.6) * 1e-6 + 14 / 8 * 8 / (141.0e9)
    assert collective_time(H100, "all_reduce", 8, 8, 1) == pytest.approx(by_hand, rel=1e-9)


def test_a_middle_all_reduce_on_one_node_takes_ll128():
    size = 4 * 2**20
    ll128 = (14.0 + 14 * 1.9) * 1e-6 + 14 / 8 * size / (0.92 * _node_bus(H100))
    ll = (6.6 + 14 * 0.6) * 1e-6 + 14 / 8 * size / (141.0e9)  # capped at 141 GB/s: slower at 4 MiB
    simple = (8.4 + 14 * 3.4) * 1e-6 + 14 / 8 * size / _node_bus(H100)
    assert ll128 < min(ll, simple)
    assert collective_time(H100, "all_reduce", size, 8, 1) == pytest.approx(ll128, rel=1e-9)


def test_a_large_all_gather_on_one_node_takes_simple_at_the_tiers_bandwidth():
    size = 2**30
    by_hand = (8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * size / _node_bus(H100)
    assert collective_time(H100, "all_gather", size, 8, 1) == pytest.approx(by_hand, rel=1e-9)


def test_a_spanning_ring_pays_network_hops_and_the_hosts_post_overhead():
    # 64 A100s on 8 DGX nodes, a tiny all-gather: 63 steps, 7 of them on the network; on AMD hosts an NVLink hop
    # of a spanning ring costs at least the 2 us post overhead; LL is the cheapest per step
    by_hand = (6.6 + 56 * 2.0 + 7 * 2.7) * 1e-6
    assert collective_time(A100, "all_gather", 64, 64, 1) == pytest.approx(by_hand, rel=1e-3)


def test_one_rank_per_node_uses_the_trees_network_latency():
    # 4 ranks 8 apart (one per node), a tiny reduce-scatter: 3 network steps at LL's tree hop (5.0 us)
    by_hand = (6.6 + 3 * 5.0) * 1e-6
    assert collective_time(H100, "reduce_scatter", 64, 4, 8) == pytest.approx(by_hand, rel=1e-3)


def test_ll_bandwidth_across_many_nodes_is_capped_by_the_host():
    # a 1 MiB all-gather over 64 A100s on 8 nodes: the ring's Simple bus bandwidth is the node's 8 NICs, LL would
    # run at half of it but is capped at 19 GB/s on AMD hosts, so LL128 wins despite its higher latency
    size, bus = 2**20, min(A100.tiers[0].achieved_gbps, 8 * A100.tiers[1].achieved_gbps) * 1e9
    ll = (6.6 + 56 * 2.0 + 7 * 2.7) * 1e-6 + 63 / 64 * size / 19.0e9
    ll128 = (14.0 + 56 * 2.0 + 7 * 4.0) * 1e-6 + 63 / 64 * size / (0.92 * bus)
    assert ll128 < ll < ll128 + 1e-4
    assert collective_time(A100, "all_gather", size, 64, 1) == pytest.approx(ll128, rel=1e-9)


def test_without_the_nccl_field_a_tier_is_one_alpha_beta_ring():
    plain = dataclasses.replace(H100, nccl=None)
    inner = plain.tiers[0]
    by_hand = 14 * inner.latency_us * 1e-6 + 14 / 8 * 2**20 / (inner.achieved_gbps * 1e9)
    assert collective_time(plain, "all_reduce", 2**20, 8, 1) == pytest.approx(by_hand, rel=1e-9)


def test_the_protocols_are_a_hardware_field_an_override_can_turn():
    from stageopt.hardware.presets import apply_hw_overrides
    slower = apply_hw_overrides(A100, ["nccl.net_overhead_us=4.0"])
    assert collective_time(slower, "all_gather", 64, 64, 1) == pytest.approx((6.6 + 56 * 4.0 + 7 * 2.7) * 1e-6,
                                                                             rel=1e-3)


def test_a_tier_running_another_algorithm_keeps_its_alpha_beta_time():
    from stageopt.hardware.collectives import CollectiveAlgorithms
    tree = dataclasses.replace(H100, node=dataclasses.replace(H100.node, collectives=CollectiveAlgorithms(
        all_reduce="tree")))
    inner = tree.tiers[0]
    by_hand = 2 * 3 * inner.latency_us * 1e-6 + 14 / 8 * 2**20 / (inner.achieved_gbps * 1e9)  # 2 ceil(log2 8) steps
    assert collective_time(tree, "all_reduce", 2**20, 8, 1) == pytest.approx(by_hand, rel=1e-9)
    size, bus = 2**21, inner.achieved_gbps * 1e9  # its all-gather is still a ring, so still NCCL's choice
    ll = (6.6 + 7 * 0.6) * 1e-6 + 7 / 8 * size / 141.0e9
    ll128 = (14.0 + 7 * 1.9) * 1e-6 + 7 / 8 * size / (0.92 * bus)
    simple = (8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * size / bus
    assert collective_time(tree, "all_gather", size, 8, 1) == pytest.approx(min(ll, ll128, simple), rel=1e-9)
