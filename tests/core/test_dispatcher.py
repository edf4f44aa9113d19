"""MoE token dispatch: the plain all-to-all against node-deduplicated dispatch (DeepEP / HybridEP, Megatron-Core's
flex dispatcher, DeepSeek-V3 sec. 3.2.2), checked against hand-worked byte counts on two network tiers."""

from __future__ import annotations

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time, ranks_hit, remote_nodes_hit
from stageopt.launch import launch_settings
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload

MODEL = ("deepseek-v3", ["layers=4", "dense_layers=1", "seq=1024"])


def test_expected_remote_nodes_of_a_token() -> None:
    """Top-8 over experts spread on 4 nodes: each other node misses all 8 with probability (3/4)^8."""
    assert remote_nodes_hit(4, 8) == pytest.approx(3 * (1 - 0.75 ** 8))
    assert remote_nodes_hit(1, 8) == 0.0
    assert remote_nodes_hit(2, 1) == pytest.approx(0.5)  # one copy: the other node half the time


def test_group_limited_routing_reaches_fewer_nodes() -> None:
    """DeepSeek-V3's 8 groups, 4 per token: on 8 nodes (a group each) a token reaches exactly 4 nodes, 7/8 of
    them remote; on 4 nodes (two groups each) a node is missed when all 4 picks come from the other 6 groups."""
    assert remote_nodes_hit(8, 8, 8, 4) == pytest.approx(4 * 7 / 8)
    assert remote_nodes_hit(4, 8, 8, 4) == pytest.approx(4 * (1 - 15 / 70) * 3 / 4)
    pool = 4 * 2  # on 16 nodes each group spans 2: a token's 8 copies fall on the 8 nodes of its 4 groups
    assert remote_nodes_hit(16, 8, 8, 4) == pytest.approx(pool * (1 - (1 - 1 / pool) ** 8) * 15 / 16)
    assert remote_nodes_hit(12, 8, 8, 4) == pytest.approx(remote_nodes_hit(12, 8))  # groups not whole: uniform


def test_expected_ranks_a_token_reaches() -> None:
    """Qwen3-30B on one node (128 experts, 16 a rank, top 8): a rank misses all 8 with probability (7/8)^8, so a
    token reaches 8(1 - (7/8)^8) = 5.25 ranks, not 8; DeepSeek-V3's group limit on 64 ranks (8 groups of 8 ranks,
    4 groups a token) leaves 32 candidate ranks for its 8 copies."""
    assert ranks_hit(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8))
    assert ranks_hit(1, 8) == 1.0
    assert ranks_hit(64, 8, 8, 4) == pytest.approx(32 * (1 - (31 / 32) ** 8))
    assert ranks_hit(8, 1) == pytest.approx(1.0)  # one copy, one rank


def test_a_gate_routing_each_token_to_one_block_of_k_experts_is_group_limited_routing() -> None:
    """NeMo AutoModel's FakeBalancedGate gives token t the experts t*k .. t*k+k-1 (mod E): one aligned block of k,
    written router_groups=E/k, router_group_topk=1. Qwen3-30B's blocks of 8 on 16 experts a rank reach one rank;
    DeepSeek-V3's on 4 experts a rank reach two ranks of one node, so a token leaves its node at most once."""
    assert ranks_hit(8, 8, 128 // 8, 1) == pytest.approx(1.0)
    assert ranks_hit(64, 8, 256 // 8, 1) == pytest.approx(2 * (1 - 0.5 ** 8))
    assert remote_nodes_hit(8, 8, 256 // 8, 1) == pytest.approx(7 / 8)


def test_one_group_a_token_reaches_the_domains_its_block_of_experts_overlaps() -> None:
    """Kimi K2's 384 experts on 32 ranks (12 a rank) under AutoModel's fake gate (one block of 8 consecutive experts
    a token): blocks 0, 2 fit in one rank and block 1 straddles two, so a token reaches 4/3 ranks, and one node of the
    4 (each holds 12 whole blocks). With fewer copies than the block: 12 experts in 3 blocks of 4 on 2 domains of 6,
    two copies: the middle block misses either half with probability C(2,2)/C(4,2) = 1/6, so (1 + 5/3 + 1)/3."""
    assert ranks_hit(32, 8, 48, 1, 384) == pytest.approx(4 / 3)
    assert remote_nodes_hit(4, 8, 48, 1, 384) == pytest.approx(3 / 4)
    assert ranks_hit(2, 2, 3, 1, 12) == pytest.approx(11 / 9)
    assert ranks_hit(32, 8, 48, 1) == pytest.approx(ranks_hit(32, 8))  # no expert count: uniform, as before


def test_flex_all_to_all_sends_each_token_once_per_node_and_rank() -> None:
    """32 ranks over 4 H100 nodes, a buffer of 8 routed copies per token: the scale-out tier carries
    S/8 x 3(1 - 0.75^8) bytes instead of 3/4 of S, and NVLink one copy per rank reached, S/8 x 32(1 - (31/32)^8),
    of which 7/8 leave the GPU (direct exchange). Inside one node only the per-rank deduplication remains."""
    hw = load_hardware("h100-sxm")
    inner, outer = hw.tiers
    size = 1e9
    flat = collective_time(hw, "all_to_all", size, 32, 1)
    flex = collective_time(hw, "all_to_all", size, 32, 1, copies=8)
    reached = 32 * (1 - (31 / 32) ** 8)
    nvlink = inner.latency_us * 1e-6 + 7 / 8 * size / 8 * reached / (inner.achieved_gbps * 1e9)
    ib = outer.latency_us * 1e-6 + size / 8 * 3 * (1 - 0.75 ** 8) / (outer.achieved_gbps * 1e9)
    assert flex == pytest.approx(nvlink + ib)
    plain_ib = outer.latency_us * 1e-6 + 0.75 * size / (outer.achieved_gbps * 1e9)
    assert flat == pytest.approx(inner.latency_us * 1e-6 + 7 / 8 * size / 4 / (inner.achieved_gbps * 1e9) + plain_ib)
    one_node = inner.latency_us * 1e-6 + 7 / 8 * size / 8 * 8 * (1 - (7 / 8) ** 8) / (inner.achieved_gbps * 1e9)
    assert collective_time(hw, "all_to_all", size, 8, 1, copies=8) == pytest.approx(one_node)
    assert collective_time(hw, "all_to_all", size, 8, 1) == pytest.approx(
        inner.latency_us * 1e-6 + 7 / 8 * size / (inner.achieved_gbps * 1e9))


def test_analytical_and_replay_price_the_same_flex_dispatch() -> None:
    hw = load_hardware("h100-sxm")
    model = load_model(*MODEL)
    times = {}
    for dispatcher in ("alltoall", "flex"):
        work = build_workload(model, Plan.parse(f"dp=32 ep=32 mbs=1 gbs=32 dispatcher={dispatcher}"), 32)
        analytical = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_ep_comm"]
        replay = ReplaySimulator().evaluate(work, hw).time_breakdown_s["exposed_ep_comm"]
        assert replay == pytest.approx(analytical, rel=1e-9)
        times[dispatcher] = analytical
    assert times["flex"] < times["alltoall"]


def test_the_stack_sets_the_dispatcher_and_a_plan_overrides_it() -> None:
    assert Plan.parse("dp=8 ep=8 gbs=8").dispatcher == "alltoall"  # Megatron-Core's default dispatcher
    hai = Plan.parse("dp=8 ep=8 gbs=8", framework=load_profile("hai-llm"))
    assert hai.dispatcher == "flex" and "dispatcher=flex" in str(hai)
    assert Plan.parse("dp=8 ep=1 gbs=8 dispatcher=flex").dispatcher == "alltoall"  # nothing to dispatch
    assert Plan.parse(str(Plan.parse("dp=8 ep=8 gbs=8 dispatcher=flex"))).dispatcher == "flex"
    with pytest.raises(InfeasiblePlan, match="'dispatcher' must be one of alltoall, flex"):
        Plan.parse("dp=8 ep=8 gbs=8 dispatcher=deepep")


def test_flex_dispatch_is_exported_to_megatron_and_bridge() -> None:
    model, plan = load_model("mixtral-8x7b"), Plan.parse("dp=16 ep=16 gbs=16 dispatcher=flex", gpus=16)
    args = list(launch_settings("megatron", model, plan).settings["args"])
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "deepep"
    overrides = launch_settings("megatron-bridge", model, plan).settings
    assert "model.moe_token_dispatcher_type=flex" in str(overrides)


def test_astra_sim_output_names_the_flex_dispatch_it_does_not_model() -> None:
    """ASTRA-sim runs the trace's plain all-to-all, so its notes say a flex plan is priced differently."""
    from stageopt.program.stage_program import build_programs
    from stageopt.sim.backend_notes import FLEX, astra_sim_notes

    model = load_model(*MODEL)
    for dispatcher, named in (("flex", True), ("alltoall", False)):
        work = build_workload(model, Plan.parse(f"dp=16 ep=16 mbs=1 gbs=16 dispatcher={dispatcher}"), 16)
        notes = astra_sim_notes(build_programs(work), work.plan, {}, 2, "unaware")
        assert (FLEX in notes) is named
