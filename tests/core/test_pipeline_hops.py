"""Pipeline messages between nodes where the stages are narrower than a node.

A pipeline of 16 single-GPU stages on 8-GPU nodes keeps 14 of its 15 hops
inside a node; the hop between stage 7 and 8 runs over the network, and a
blocking 1F1B schedule waits for it every micro-batch. Before, every hop of
such a plan was priced at NVLink speed.
"""

import numpy as np
import pytest

from stageopt.hardware import load_hardware
from stageopt.hardware.network import pipeline_hop_crosses, pipeline_message_time, pipeline_path_time
from stageopt.hardware.presets import apply_hw_overrides
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.program.durations import node_durations
from stageopt.program.nodes import SEND
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.analytical_stages import message_times, stage_hops
from stageopt.workload import build_workload


def test_hops_cross_only_at_node_boundaries():
    hw = load_hardware("a100-80g")  # 8 GPUs a node
    stages = np.arange(16)
    crosses = pipeline_hop_crosses(hw, 1, stages, (stages + 1) % 16)
    assert list(np.flatnonzero(crosses)) == [7, 15]  # 7 -> 8, and the interleaved wrap 15 -> 0
    assert pipeline_hop_crosses(hw, 8, 0, 1)  # a node a stage: every hop leaves its node
    assert not pipeline_hop_crosses(hw, 4, 0, 1)  # pp 2 x 4 ranks: one node


def test_a_stage_straddling_a_72_gpu_domain_crosses_on_one_side_per_rank():
    hw = load_hardware("gb200-nvl72")  # 72 GPUs an NVLink domain
    # stage 4 of 16-rank stages holds ranks 64-79: its first rank leaves the domain forwards (64 -> 80),
    # its last backwards (79 -> 63); neither crosses both ways
    assert pipeline_hop_crosses(hw, 16, 4, 5, offset=0) and not pipeline_hop_crosses(hw, 16, 4, 3, offset=0)
    assert pipeline_hop_crosses(hw, 16, 4, 3, offset=15) and not pipeline_hop_crosses(hw, 16, 4, 5, offset=15)


def _hand_message_seconds(tier, size):
    return tier.latency_us * 1e-6 + size / (tier.bandwidth_gbps * tier.efficiency * 1e9)


def test_stage_hops_price_the_boundary_hop_at_the_network():
    hw = load_hardware("a100-80g")
    plan = Plan.parse("pp=16 mbs=1 gbs=16 sp=off")
    size = 2048 * 4096 * 2.0  # one micro-batch's residual stream: seq x hidden x 2 bytes
    c = {k: np.array([v]) for k, v in {"tp": 1, "cp": 1, "dp": 1, "pp": 16}.items()}
    comp = {"sends": np.array([2.0]), "sends_next": np.array([1.0])}
    inside, between = (_hand_message_seconds(t, size) for t in hw.tiers[:2])
    messages = message_times(hw, plan, np.array([size]), c)
    forward, backward = stage_hops(hw, messages, c, 7, comp)
    assert forward[0] == pytest.approx(between) and backward[0] == pytest.approx(inside)
    forward, backward = stage_hops(hw, messages, c, 3, comp)
    assert forward[0] == pytest.approx(inside) and backward[0] == pytest.approx(inside)


def _work():
    model = load_model("llama3-8b", ["layers=30", "vocab=1024"])  # a cheap head: a middle stage is the slowest
    return build_workload(model, Plan.parse("pp=16 mbs=1 gbs=32 layout=Et|(tt|)*14tL"))


def test_one_f1b_waits_for_the_network_hop_every_micro_batch():
    """p2p seconds on 8-GPU nodes less on 16-GPU nodes (every hop inside) = m x (network - NVLink) message."""
    work = _work()
    hw8 = load_hardware("a100-80g")
    hw16 = apply_hw_overrides(hw8, ["node.gpus=16"])
    p2p = [AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["pipeline_p2p"] for hw in (hw8, hw16)]
    size = work.model.seq * work.model.hidden * 2.0
    inside, between = (_hand_message_seconds(t, size) for t in hw8.tiers[:2])
    assert p2p[0] - p2p[1] == pytest.approx(32 * (between - inside), rel=1e-6)


def test_replay_prices_each_send_by_its_hop():
    work = _work()
    hw = load_hardware("a100-80g")
    size = work.model.seq * work.model.hidden * 2.0
    inside, between = (_hand_message_seconds(t, size) for t in hw.tiers[:2])
    for stage, forward in ((7, between), (3, inside)):
        program = build_stage_program(work, stage)
        times = node_durations(program, work, hw)
        sends = {n.peer: times[n.id] for n in program.nodes if n.type == SEND}
        assert sends["next"] == pytest.approx(forward) and sends["prev"] == pytest.approx(inside)


def test_message_time_defaults_to_the_stride_rule():
    hw = load_hardware("h100-sxm")
    plan = Plan.parse("tp=8 pp=2")
    assert pipeline_message_time(hw, plan, 1e6, 8, 8) == pytest.approx(pipeline_message_time(hw, plan, 1e6, 8, 8,
                                                                                             True))


def test_a_serving_step_passes_every_hop_in_turn():
    """tp 4 x pp 4 on 8-GPU nodes: of the three hops, the middle one leaves the node."""
    hw = load_hardware("h100-sxm")
    size = 4096 * 8192 * 2.0
    inside, between = (_hand_message_seconds(t, size) for t in hw.tiers[:2])
    assert pipeline_path_time(hw, size, 4, 4) == pytest.approx(2 * inside + between)
    assert pipeline_path_time(hw, size, 8, 2) == pytest.approx(between)
    # 16-rank stages in 72-GPU domains: stage 4 (ranks 64-79) straddles, so both of its hops leave a domain
    nvl = load_hardware("gb200-nvl72")
    inside, between = (_hand_message_seconds(t, size) for t in nvl.tiers[:2])
    assert pipeline_path_time(nvl, size, 16, 6) == pytest.approx(3 * inside + 2 * between)
