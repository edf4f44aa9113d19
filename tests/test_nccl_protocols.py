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


def _on_release(hw, release):
    return dataclasses.replace(hw, nccl=dataclasses.replace(hw.nccl, release=release))


def test_nccl_2_8_prices_a_spanning_ring_without_the_hosts_post_overhead():
    # tuning.cc at v2.8.4-1: LL base 3.6 us, NVLink hop 0.47 us x 1.8 on a ring that leaves the node, network hop
    # 2.7 us, no post overhead. 64 A100s on 8 nodes, a tiny all-gather: 56 NVLink and 7 network steps
    by_hand = (3.6 + 56 * 0.47 * 1.8 + 7 * 2.7) * 1e-6
    assert collective_time(_on_release(A100, "2.8"), "all_gather", 64, 64, 1) == pytest.approx(by_hand, rel=1e-3)


def test_nccl_2_8_runs_ll_at_a_third_of_the_bandwidth_on_one_node_and_a_quarter_in_an_all_reduce():
    hw, size = _on_release(A100, "2.10"), 256 * 2**10
    bus = _node_bus(A100)
    gather = [(3.6 + 7 * 0.47) * 1e-6 + 7 / 8 * size / min(bus / 3, 87.7e9),
              (10.0 + 7 * 1.9) * 1e-6 + 7 / 8 * size / (0.92 * bus), (8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * size / bus]
    reduce = [(3.6 + 14 * 0.47) * 1e-6 + 14 / 8 * size / min(bus / 4, 87.7e9),
              (10.0 + 14 * 1.9) * 1e-6 + 14 / 8 * size / (0.92 * bus), (8.4 + 14 * 3.4) * 1e-6 + 14 / 8 * size / bus]
    assert collective_time(hw, "all_gather", size, 8, 1) == pytest.approx(min(gather), rel=1e-9)
    assert collective_time(hw, "all_reduce", size, 8, 1) == pytest.approx(min(reduce), rel=1e-9)


def test_nccl_2_12_charges_28_us_a_network_hop_under_simple():
    # a 1 GiB all-gather over 16 A100s on 2 nodes is bandwidth-bound, so Simple: 14 NVLink hops at 3.4 us and
    # 1 network hop at 28 us (9.6 us in 2.8-2.11 and 2.14-2.17), on top of the 8.4 us base
    size = 2**30
    bus = min(A100.tiers[0].achieved_gbps, 8 * A100.tiers[1].achieved_gbps) * 1e9
    for release, hop in (("2.12", 28.0), ("2.11", 9.6), ("2.14", 9.6)):
        by_hand = (8.4 + 14 * 3.4 + hop) * 1e-6 + 15 / 16 * size / bus
        assert collective_time(_on_release(A100, release), "all_gather", size, 16, 1) == pytest.approx(by_hand,
                                                                                                      rel=1e-9)


@pytest.mark.parametrize("release, expected", [("2.8", "2.8"), ("2.10.3", "2.8"), ("2.13", "2.12"),
                                               ("2.17.1", "2.14"), ("2.19", "2.18"), ("2.22", "2.21"),
                                               ("2.29", "2.23")])
def test_a_release_takes_the_table_of_the_newest_change_at_or_before_it(release, expected):
    from stageopt.hardware.nccl_protocols import NCCL_RELEASES, release_protocols
    assert release_protocols(release) is dict(NCCL_RELEASES)[expected]


def test_the_oldest_release_a_profile_may_name_is_the_oldest_table():
    from stageopt.frameworks.profile import OLDEST_NCCL_RELEASE, nccl_version
    from stageopt.hardware.nccl_protocols import NCCL_RELEASES
    assert nccl_version(NCCL_RELEASES[0][0]) == OLDEST_NCCL_RELEASE


@pytest.mark.parametrize("release, fragment", [("2.7", "predates"), ("two", "not a version")])
def test_a_release_stageopt_cannot_price_is_a_one_line_error(release, fragment):
    from stageopt.errors import ConfigError
    with pytest.raises(ConfigError, match=fragment):
        _on_release(A100, release)


def test_a_profile_sets_the_release_and_the_accuracy_record_still_applies():
    from stageopt.frameworks import load_profile
    old = A100.for_stack(load_profile("megatron-lm-2021"))
    assert old.nccl.release == "2.8" and A100.for_stack(load_profile("megatron-core")) is A100
    assert old.fingerprint() == A100.fingerprint()  # the release is the software's, not the machine's


def test_a_profiles_release_prices_a_plan_as_that_release_on_the_hardware_would(tmp_path):
    # a custom stack on NCCL 2.23 is the 2021 stack run on a machine whose nccl field names 2.23; ZeRO-3 over 4
    # nodes crosses the network on every gather, which costs more than on 2.8 (LL128 base 14 us, not 10; each NVLink
    # hop at least the AMD host's 2 us post overhead)
    from stageopt.frameworks import load_profile
    from stageopt.model import load_model
    from stageopt.parallel.plan import Plan
    from stageopt.sim.analytical import AnalyticalSimulator
    from stageopt.sim.replay import ReplaySimulator
    from stageopt.workload import build_workload

    custom = tmp_path / "ds-2024.yaml"
    custom.write_text('base: megatron-deepspeed-2021\nname: ds-2024\nnccl_release: "2.23"\n')
    unset = tmp_path / "ds-unset.yaml"
    unset.write_text('base: megatron-deepspeed-2021\nname: ds-unset\nnccl_release: null\n')
    model = load_model("gpt3-175b", ["layers=4", "seq=2048"])

    def seconds(framework, hw, sim):
        plan = Plan.parse("tp=1 pp=1 dp=32 mbs=1 gbs=32 zero=3 recompute=full dtype=fp16",
                          framework=load_profile(framework))
        return sim.evaluate(build_workload(model, plan, 32), hw).time_breakdown_s["exposed_dp_comm"]

    for sim in (AnalyticalSimulator(), ReplaySimulator()):
        by_profile = seconds(custom, A100, sim)
        assert by_profile == pytest.approx(seconds(unset, _on_release(A100, "2.23"), sim), rel=1e-9)
        assert by_profile > seconds("megatron-deepspeed-2021", A100, sim)


@pytest.mark.parametrize("value, fragment", [('"2.7"', "predates"), ("2.10", "put it in quotes")])
def test_a_profile_naming_a_release_it_cannot_be_is_a_one_line_error_at_load(tmp_path, capsys, value, fragment):
    from stageopt.cli import main
    path = tmp_path / "old.yaml"
    path.write_text(f"base: megatron-core\nname: old\nnccl_release: {value}\n")
    code = main(["simulate", "--model", "llama3-8b", "--gpus", "8", "--plan", "dp=8 gbs=8", "--framework", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and len(err.splitlines()) == 1


def test_a_small_all_reduce_across_many_nodes_runs_as_ncclss_tree():
    # 1 KB over 1,024 H100s, 8 a node (128 nodes): the tree's LL costs its 6.8 us base plus, both ways, 7 NVLink
    # hops of 0.6 us and log2(128) = 7 network hops of 5.0 us; the ring would take 2,046 steps
    by_hand = (6.8 + 2 * (7 * 0.6 + 7 * 5.0)) * 1e-6 + 1000 / (0.5 * 20.4e9)
    assert collective_time(H100, "all_reduce", 1000, 1024, 1) == pytest.approx(by_hand, rel=1e-9)


def test_the_tree_takes_its_medium_size_correction_and_the_ring_keeps_large_messages():
    from stageopt.hardware.nccl_protocols import ring_protocol_time
    from stageopt.hardware.nccl_tree import tree_all_reduce_time
    bus = min(H100.tiers[0].achieved_gbps, 8 * H100.tiers[1].achieved_gbps)
    # 1 MiB = 64 B x 2^14 over 16 nodes of 8: NCCL's corrections at index 14 are LL 0.5, LL128 0.6, Simple 0.5
    size = 2**20
    ll = (6.8 + 2 * (7 * 0.6 + 4 * 5.0)) * 1e-6 + size / (0.5 * min(bus * 0.92 / 3.8, 20.4) * 0.5 * 1e9)
    ll128 = (14.0 + 2 * (7 * 1.25 + 4 * 8.5)) * 1e-6 + size / (0.5 * bus * 0.92 * 120 / 128 * 0.6 * 1e9)
    simple = (8.4 + 2 * (7 * 4.0 + 4 * 14.0)) * 1e-6 + size / (0.5 * bus * 0.92 * 0.5 * 1e9)
    assert tree_all_reduce_time(H100.nccl, size, 8, 16, bus) == pytest.approx(min(ll, ll128, simple), rel=1e-9)
    # 1 GiB over 2 nodes: the tree's 0.92 of the bandwidth loses to the ring (30 steps), which NCCL then runs
    big = 2**30
    ring = ring_protocol_time(H100.nccl, "all_reduce", big, 16, 2, bus, per_node=8)
    assert tree_all_reduce_time(H100.nccl, big, 8, 2, bus) > ring
    assert collective_time(H100, "all_reduce", big, 16, 1) == pytest.approx(float(ring), rel=1e-9)


def test_nccl_2_8_builds_its_tree_from_older_constants():
    # v2.8.4-1: tree bases 4.4 us, LL NVLink hops 0.52 us x 1.8 across nodes, LL network hops 5.0 us
    by_hand = (4.4 + 2 * (7 * 0.52 * 1.8 + 7 * 5.0)) * 1e-6 + 1000 / (0.5 * 19.0e9)  # AMD host's LL cap, 19 GB/s
    assert collective_time(_on_release(A100, "2.8"), "all_reduce", 1000, 1024, 1) == pytest.approx(by_hand,
                                                                                                   rel=1e-9)


def test_gathers_and_one_node_all_reduces_have_no_tree():
    from stageopt.hardware.nccl_protocols import ring_protocol_time
    bus = H100.tiers[0].achieved_gbps
    assert collective_time(H100, "all_reduce", 1000, 8, 1) == pytest.approx(
        float(ring_protocol_time(H100.nccl, "all_reduce", 1000, 8, 1, bus)), rel=1e-12)
    spanning = min(bus, 8 * H100.tiers[1].achieved_gbps)
    assert collective_time(H100, "all_gather", 1000, 1024, 1) == pytest.approx(
        float(ring_protocol_time(H100.nccl, "all_gather", 1000, 1024, 128, spanning, per_node=8)), rel=1e-12)
