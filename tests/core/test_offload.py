"""Activation offloading (Megatron-Core's --cpu-offloading-num-layers), checked by hand.

Memory: the first N layers' saved tensors leave HBM but one offloaded layer is
in flight, so a uniform model's activations drop by (N - 1) layers' saved
bytes. Time: each offloaded layer is copied out under the next layer's forward
and back under the next layer's backward; over a link slow enough that neither
hides it, each layer adds 2 c - (f + b) per micro-batch, c = saved bytes / link
bandwidth and f + b one layer's compute (the difference between a model with
one layer more and one less). The replay, which runs the copies on a copy-engine
slot with Transformer Engine's waits, must expose the same.
"""

from __future__ import annotations

import json

import pytest

from stageopt.chakra import NodeType, node_attrs, read_trace
from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import load_hardware
from stageopt.launch import launch_settings
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.program.generate import generate
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for
from stageopt.workload import peak_memory

MODEL, LAYERS = "llama3-8b", ["layers=6", "seq=2048"]
PLAN = "tp=1 pp=1 dp=8 mbs=1 gbs=16 zero=1 recompute=none dtype=bf16"
GIB = 2**30


def layer_saved_bytes() -> float:
    model = load_model(MODEL, LAYERS)
    plan = Plan.parse(PLAN, framework=load_profile("megatron-core"))
    return float(compile_block("dense", arch_of(model, plan), "none").evaluate(symbol_values(model, plan))["saved_bytes"])


def simulate(plan: str, layers=LAYERS, hw_set=()):
    return simulate_plan(MODEL, plan, None, hardware="h100-sxm", model_set=layers, hw_set=hw_set)[1]


@pytest.mark.parametrize("n", [1, 3, 5])
def test_offloaded_layers_leave_hbm_but_one_in_flight(n):
    base, off = simulate(PLAN), simulate(f"{PLAN} offload_layers={n}")
    dropped = (base.memory_breakdown_gib["activations"] - off.memory_breakdown_gib["activations"]) * GIB
    assert dropped == pytest.approx((n - 1) * layer_saved_bytes(), rel=1e-6)


def test_workload_memory_agrees_with_the_analytical_model():
    work = workload_for(MODEL, f"{PLAN} offload_layers=4", None, model_set=LAYERS)
    by_stage = peak_memory(work)
    analytical = simulate(f"{PLAN} offload_layers=4").memory_breakdown_gib["activations"]
    assert by_stage[0].activations / GIB == pytest.approx(analytical, rel=1e-9)


def test_a_slow_link_exposes_both_copies_less_the_compute_beside_them():
    slow = ["gpu.host_link_gbps=0.5"]  # 0.5 GB/s: a layer's copy outlasts any layer's compute
    n, m = 3, 2  # layers offloaded; micro-batches per rank (gbs 16 / dp 8)
    one_more = simulate(PLAN, ["layers=7", "seq=2048"]).time_breakdown_s["compute"]
    per_layer = (one_more - simulate(PLAN).time_breakdown_s["compute"]) / m  # f + b of one layer
    copy = layer_saved_bytes() / 0.5e9
    got = simulate(f"{PLAN} offload_layers={n}", hw_set=slow)
    assert got.time_breakdown_s["activation_offload"] == pytest.approx(m * n * (2 * copy - per_layer), rel=1e-6)
    base = simulate(PLAN, hw_set=slow)
    assert got.iteration_time_s - base.iteration_time_s == pytest.approx(
        got.time_breakdown_s["activation_offload"], rel=1e-6)


def test_a_fast_link_hides_the_copies():
    got = simulate(f"{PLAN} offload_layers=3", hw_set=["gpu.host_link_gbps=100000"])
    assert got.time_breakdown_s["activation_offload"] == 0.0
    assert got.iteration_time_s == pytest.approx(simulate(PLAN).iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("plan, field", [
    (f"{PLAN.replace('pp=1 dp=8', 'pp=2 dp=4')} offload_layers=2", "pp=1"),
    (f"{PLAN.replace('recompute=none', 'recompute=full')} offload_layers=2", "recompute=none"),
    (f"{PLAN} offload_layers=6", "at most 5"),
])
def test_megatron_core_rules_are_one_line_refusals(plan, field):
    with pytest.raises(InfeasiblePlan, match=field):
        simulate(plan)


@pytest.mark.parametrize("link", ["64", "0.5"])
def test_replay_runs_the_copies_as_the_analytical_model_prices_them(link):
    """The replay puts each copy on the copy engine with Transformer Engine's waits; on a uniform stack it
    exposes what the closed form does, over a fast link and a slow one. (Contention beside gradient buckets is
    switched off: the copies move which kernels run beside a bucket, which the closed form does not follow.)"""
    plan = f"{PLAN} offload_layers=3"
    hw_set = [f"gpu.host_link_gbps={link}", "gpu.efficiency.overlap_slowdown=0"]
    analytical = simulate(plan, hw_set=hw_set)

    def replay(text):
        return simulate_plan(MODEL, text, None, hardware="h100-sxm", model_set=LAYERS, hw_set=hw_set,
                             simulator=ReplaySimulator())[1]

    with_copies, without = replay(plan), replay(PLAN)
    assert with_copies.time_breakdown_s["activation_offload"] == pytest.approx(
        analytical.time_breakdown_s["activation_offload"], rel=1e-6, abs=1e-9)
    assert with_copies.iteration_time_s - without.iteration_time_s == pytest.approx(
        analytical.time_breakdown_s["activation_offload"], rel=1e-6, abs=1e-9)


def test_traces_carry_the_copies_as_astra_sim_memory_nodes(tmp_path):
    """Offloads and reloads are MEM_STORE / MEM_LOAD nodes on ASTRA-sim's CPU slot, timed by per-GPU remote
    memory at the host link's bandwidth; a link left unknown is a one-line error."""
    work = workload_for(MODEL, f"{PLAN} offload_layers=2", None, model_set=LAYERS)
    generate(work, load_hardware("h100-sxm"), tmp_path)
    memory = json.loads((tmp_path / "memory.json").read_text())
    assert memory == {"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-latency": 0, "remote-mem-bw": 64}
    nodes = read_trace(tmp_path / "workload.0.et").nodes
    stores = [n for n in nodes if n.type == NodeType.MEM_STORE_NODE]
    loads = [n for n in nodes if n.type == NodeType.MEM_LOAD_NODE]
    assert len(stores) == len(loads) == 2 * work.plan.microbatches  # 2 layers, every micro-batch
    attrs = node_attrs(stores[0])
    assert attrs["is_cpu_op"] is True and attrs["tensor_size"] == int(layer_saved_bytes())
    with pytest.raises(ConfigError, match="host_link_gbps"):
        simulate(f"{PLAN} offload_layers=2", hw_set=["gpu.host_link_gbps=null"])


def test_exports_name_megatrons_flags():
    model = load_model(MODEL, LAYERS)
    plan = Plan.parse(f"{PLAN} offload_layers=2")
    megatron = launch_settings("megatron", model, plan).text
    assert "--cpu-offloading" in megatron and "--cpu-offloading-num-layers 2" in megatron
    bridge = launch_settings("megatron-bridge", model, plan).text
    assert "model.cpu_offloading_num_layers=2" in bridge
    with pytest.raises(ConfigError, match="torchtitan"):
        launch_settings("torchtitan", model, plan)
