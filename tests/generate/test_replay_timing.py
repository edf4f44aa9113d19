"""A generated two-stage pipeline replays to the times derived by hand from ASTRA-sim's
rules (each kernel its ``duration_micros`` with the roofline off, hops x latency + size /
bandwidth per message), which shows the schedule encoded in the dependencies is the one that runs."""

from __future__ import annotations

import json

import yaml

from stageopt.astrasim.trace_replay import replay_trace_set
from stageopt.chakra import NodeType, node_attrs, read_trace

from .matrix import LLAMA

CASE = (LLAMA, "pp=2 gbs=1", 2, "layer")  # one micro-batch, one rank per stage, no collectives


def kernel_ns(node) -> int:  # ASTRA-sim with the roofline off: duration_micros x 1000, 1 ns if zero
    return node.duration_micros * 1000 or 1


def test_two_stage_pipeline_times_by_hand(generated) -> None:
    _work, out = generated(CASE)
    assert json.loads((out / "system.json").read_text())["roofline-enabled"] == 0
    net = yaml.safe_load((out / "network.yml").read_text())
    assert net["topology"] == ["Switch"]

    def message_ns(size: int) -> int:  # a switch is two hops
        return int(2 * net["latency"][0] + size / (net["bandwidth"][0] * 2**30 / 1e9))

    n0 = read_trace(out / "workload.0.et").nodes
    n1 = read_trace(out / "workload.1.et").nodes

    def comps(nodes: list, prefix: str) -> list:
        return [n for n in nodes if n.type == NodeType.COMP_NODE and n.name.startswith(prefix)]

    def cost(nodes: list) -> list[int]:
        return [kernel_ns(n) for n in nodes]

    def finish_of(nodes: list, times: list[int], start: int, node_id: int) -> int:
        return start + sum(t for n, t in zip(nodes, times) if n.id <= node_id)

    def send(nodes: list, prefix: str):
        return next(n for n in nodes if n.type == NodeType.COMM_SEND_NODE and n.name.startswith(prefix))

    f0, b0, f1, b1 = comps(n0, "F0"), comps(n0, "B0"), comps(n1, "F0"), comps(n1, "B0")
    opt0, opt1 = comps(n0, "optimizer"), comps(n1, "optimizer")
    tf0, tb0, tf1, tb1 = cost(f0), cost(b0), cost(f1), cost(b1)
    s0 = send(n0, "F0")
    sent0 = finish_of(f0, tf0, 0, max(s0.data_deps))  # rank 0 sends once the chunk output exists
    arrive1 = sent0 + message_ns(node_attrs(s0)["comm_size"])
    s1 = send(n1, "B0")
    stream1 = f1 + b1
    sent1 = finish_of(stream1, tf1 + tb1, arrive1, max(s1.data_deps))
    arrive0 = sent1 + message_ns(node_attrs(s1)["comm_size"])
    end1 = max(arrive1 + sum(tf1) + sum(tb1) + sum(cost(opt1)), arrive0)
    end0 = arrive0 + sum(tb0) + sum(cost(opt0))

    res = replay_trace_set(out / "workload", out / "comm_groups.json", out / "system.json", out / "network.yml")
    assert [r.cycles for r in res.ranks] == [end0, end1]
    assert res.ranks[0].exposed_comm_cycles == end0 - sum(tf0) - sum(tb0) - sum(cost(opt0))
