"""Full-iteration CUDA graphs (``cuda_graphs=on``, Megatron-Core's ``--cuda-graph-impl full_iteration``).

Hand derivations: a kernel replayed from a graph costs the graph's launch gap plus its device work (an
elementwise kernel: its bytes at the achievable HBM bandwidth), and no host dispatch time; launched eagerly
by a host thread that needs ``host_us`` per kernel, a run of small kernels costs ``host_us`` each.
"""

from __future__ import annotations

import pytest

from stageopt.parallel.plan import Plan
from stageopt.program.durations import node_durations
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.run import hardware_for, workload_for

MODEL, SETS = "llama3-8b", ["layers=1", "seq=128", "hidden=512", "heads=8", "kv_heads=8", "ffn=1024", "vocab=1024"]
HOST_US = 40.0


def _vector_nodes(plan: str):
    work = workload_for(MODEL, plan, 1, model_set=SETS)
    hw = hardware_for("h100-sxm", [f"gpu.efficiency.host_us={HOST_US}"])
    program = build_stage_program(work, 0)
    seconds = node_durations(program, work, hw)
    nodes = [(n, t) for n, t in zip(program.nodes, seconds)
             if n.type == "comp" and n.kernel == "vector" and n.phase in ("fwd", "bwd")]
    return nodes, hw


def test_a_graph_replays_each_kernel_at_its_launch_gap_and_bytes() -> None:
    nodes, hw = _vector_nodes("tp=1 mbs=1 gbs=1 cuda_graphs=on")
    eff = hw.gpu.efficiency
    bandwidth = hw.gpu.hbm_gbps * 1e9 * eff.memory_fraction
    for node, seconds in nodes:
        assert seconds == pytest.approx(node.launches * eff.graph_launch_us * 1e-6 + node.tensor_size / bandwidth)


def test_eager_small_kernels_wait_for_the_host() -> None:
    nodes, _ = _vector_nodes("tp=1 mbs=1 gbs=1")
    for node, seconds in nodes:  # every kernel of this toy model is shorter than the host's 40 us
        assert seconds == pytest.approx(node.launches * HOST_US * 1e-6)


def test_the_plan_knob_reads_and_prints() -> None:
    plan = Plan.parse("tp=1 mbs=1 gbs=1 cuda_graphs=on")
    assert plan.cuda_graphs and "cuda_graphs=on" in str(plan)
    assert Plan.parse(str(plan).replace("framework=megatron-core", "")) == plan
    assert not Plan.parse("tp=1 mbs=1 gbs=1").cuda_graphs
