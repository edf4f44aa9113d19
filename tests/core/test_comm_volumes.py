"""Collective volumes per rank vs hand-derived values (Megatron-LM's scheme)."""

import dataclasses

import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload
from stageopt.workload.stats import stage_stats


def stats(model, plan_text, stage=0):
    work = build_workload(model, Plan.parse(plan_text))
    return work, stage_stats(work, stage)


def uses(st, group, kind, phase):
    return [c for c in st.collectives if (c.group, c.kind, c.phase) == (group, kind, phase)]


def test_tp_all_reduce_per_layer_without_sp():
    """Two all-reduces of the b*s*h activation forward and two backward per layer (f and g operators)."""
    m = load_model("llama3-8b")
    b, s, h = 2, m.seq, m.hidden
    plan = "tp=4 pp=1 dp=1 mbs=2 gbs=6 sp=off"  # 3 micro-batches
    work, st = stats(m, plan)
    layer_bytes = b * s * h * 2
    fwd = [c for c in uses(st, "tp", "all_reduce", "fwd") if c.bytes_each == layer_bytes]
    bwd = [c for c in uses(st, "tp", "all_reduce", "bwd") if c.bytes_each == layer_bytes]
    assert sum(c.count for c in fwd) == 2 * m.layers * 3 + 3  # + the embedding's all-reduce per micro-batch
    assert sum(c.count for c in bwd) == 2 * m.layers * 3 + 3  # + the output layer's input gradient


def test_sp_replaces_all_reduce_by_gather_and_scatter_of_equal_volume():
    m = load_model("llama3-8b")
    _, st = stats(m, "tp=8 sp=on mbs=1 gbs=1")
    buf = m.seq * m.hidden * 2
    assert not [c for c in uses(st, "tp", "all_reduce", "fwd") if c.bytes_each == buf]
    ag = sum(c.count for c in uses(st, "tp", "all_gather", "fwd") if c.bytes_each == buf)
    rs = sum(c.count for c in uses(st, "tp", "reduce_scatter", "fwd") if c.bytes_each == buf)
    assert ag == 2 * m.layers + 1  # before QKV and MLP in every layer, before the output layer
    assert rs == 2 * m.layers + 1  # after attention and MLP, after the embedding


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_dp_gradient_reduction_once_per_iteration(zero):
    m = load_model("llama3-8b", ["layers=8"])
    work, st = stats(m, f"tp=2 pp=2 dp=4 mbs=1 gbs=32 zero={zero}")
    grads = uses(st, "dp_cp", "all_reduce" if zero == 0 else "reduce_scatter", "dp")
    assert len(grads) == 1 and grads[0].count == 1
    assert grads[0].bytes_each == st.params_local * 2  # bf16 gradients of every local parameter
    # params on stage 0: 4 layers and the embedding, each split over tp=2
    d = m.hidden // m.heads
    layer = 2 * m.hidden**2 + 2 * m.hidden * m.kv_heads * d + 3 * m.hidden * m.ffn
    norms = 2 * m.hidden
    assert st.params_local == 4 * (layer / 2 + norms) + m.vocab * m.hidden / 2
    if zero:
        gathers = uses(st, "dp_cp", "all_gather", "dp")
        assert gathers[0].count == 1 and gathers[0].bytes_each == st.params_local * 2


def test_zero3_gathers_parameters_per_layer_forward_and_backward():
    m = load_model("llama3-8b", ["layers=4"])
    work, st = stats(m, "tp=1 pp=1 dp=8 mbs=1 gbs=16 zero=3")  # 2 micro-batches
    (ag,) = uses(st, "dp_cp", "all_gather", "zero3")
    blocks = 4 + 2  # layers + embedding + head
    assert ag.count == 2 * 2 * blocks
    assert ag.count * ag.bytes_each == pytest.approx(2 * 2 * st.params_local * 2)
    (rs,) = uses(st, "dp_cp", "reduce_scatter", "zero3")
    assert rs.count * rs.bytes_each == pytest.approx(2 * st.params_local * 2)


def test_fsdp_under_pipelining_gathers_and_reduces_once_per_step():
    """torchtitan's FSDP2 stages stay gathered across micro-batches: one gather, one reduce-scatter of the stage."""
    from stageopt.frameworks.catalog import load_profile
    m = load_model("llama3-8b", ["layers=4"])
    plan = Plan.parse("tp=1 pp=2 dp=8 mbs=1 gbs=32 zero=3").replace(framework=load_profile("torchtitan"))
    st = stage_stats(build_workload(m, plan), 0)  # 4 micro-batches
    assert not [c for c in st.collectives if c.phase == "zero3"]
    (rs,) = uses(st, "dp_cp", "reduce_scatter", "dp")
    (ag,) = uses(st, "dp_cp", "all_gather", "dp")
    assert rs.count == ag.count == 1
    assert rs.bytes_each == ag.bytes_each == st.params_local * 2  # bf16 stage parameters, once each way
    # without pipelining, the same stack gathers per block and micro-batch (FSDP's reshard after forward)
    flat = stage_stats(build_workload(m, plan.replace(pp=1, dp=16)), 0)
    assert [c for c in flat.collectives if c.phase == "zero3"]


def test_expert_parallel_all_to_all_volume():
    """Dispatch and combine move each token's top-k copies: b*s*k*h*2 bytes per rank per MoE layer."""
    m = load_model("mixtral-8x7b", ["layers=2"])
    work, st = stats(m, "tp=1 ep=4 dp=4 mbs=1 gbs=4 zero=0")
    tokens = m.seq * 1
    volume = tokens * m.top_k * m.hidden * 2
    fwd = uses(st, "ep", "all_to_all", "fwd")
    bwd = uses(st, "ep", "all_to_all", "bwd")
    assert sum(c.count for c in fwd) == 2 * 2 and all(c.bytes_each == volume for c in fwd)
    assert sum(c.count for c in bwd) == 2 * 2 and all(c.bytes_each == volume for c in bwd)
    # expert gradients reduce over dp/ep = 1 rank: none; dense ones over dp = 4
    assert not uses(st, "edp_cp", "all_reduce", "dp")
    assert uses(st, "dp_cp", "all_reduce", "dp")


def test_context_parallel_gathers_keys_and_values():
    m = load_model("llama3-8b", ["layers=1"])
    work, st = stats(m, "tp=1 cp=4 dp=1 mbs=1 gbs=1")
    d = m.hidden // m.heads
    kv = m.seq * m.kv_heads * d * 2  # gathered K (or V) in bytes
    fwd = uses(st, "cp", "all_gather", "fwd")
    assert sum(c.count for c in fwd) == 2 and all(c.bytes_each == kv for c in fwd)
    rs = uses(st, "cp", "reduce_scatter", "bwd")
    assert sum(c.count for c in rs) == 2 and all(c.bytes_each == kv for c in rs)


def test_tp_one_has_no_tp_traffic():
    _, st = stats(load_model("llama3-8b", ["layers=2"]), "tp=1 pp=1 dp=2 mbs=1 gbs=2")
    assert not [c for c in st.collectives if c.group == "tp"]


def test_fsdp_step_sync_under_pipelining_is_one_collective_per_block():
    """Held across micro-batches, FSDP2's step-end sync is still one reduce-scatter and one all-gather per
    wrapped block (torchtitan wraps each), not DDP's 25 MB buckets. With the links made free a collective
    costs its latency only, 15 ring steps at the scale-out latency (16 ranks over two nodes); with the
    backward hiding all but the last block's reduce-scatter and the forward all but the first block's
    gather, the exposed sync is 2 x 15 steps. DDP's buckets would expose 54x that (stage 0's 2 layers and
    embedding hold 162 buckets of 6e6 parameters, a third of them per block)."""
    from stageopt.frameworks.catalog import load_profile
    from stageopt.program import ProgramOptions, build_programs
    from stageopt.program.durations import collective_buckets
    from stageopt.sim.analytical import AnalyticalSimulator
    from stageopt.sim.run import hardware_for
    m = load_model("llama3-8b", ["layers=4"])
    plan = Plan.parse("tp=1 pp=2 dp=16 mbs=1 gbs=64 zero=3").replace(framework=load_profile("torchtitan"))
    assert plan.fsdp_step_sync and plan.step_zero == 1
    work = build_workload(m, plan, 32)
    program = build_programs(work, ProgramOptions())[0]
    syncs = [n for n in program.nodes if n.phase == "dp" and n.group == "dp_cp"]
    assert len(syncs) == 2 * 3 and all(collective_buckets(n, n.comm_size, plan) == 1 for n in syncs)
    free = ["node.bandwidth_gbps=1e9", "scaleout.bandwidth_gbps=1e9", "gpu.efficiency.overlap_slowdown=0"]
    hw = dataclasses.replace(hardware_for("h100-sxm", free), nccl=None)  # the α-β ring the count is read in
    exposed = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"]
    assert exposed == pytest.approx(2 * 15 * hw.tiers[1].latency_us * 1e-6, rel=1e-3)


@pytest.mark.parametrize("stack, per_module", [("llm-foundry", True), ("torchtitan", True), ("megatron-core", False)])
def test_zero2_on_an_fsdp_stack_syncs_once_per_module(stack, per_module):
    """PyTorch FSDP's SHARD_GRAD_OP (zero=2) reduce-scatters and gathers once per wrapped block, as FULL_SHARD
    does; only a DDP-style stack (Megatron-Core's distributed optimizer) fills gradient buckets. Llama 3 8B's
    block holds 218e6 parameters: 37 of llm-foundry's and torchtitan's 25 MB DDP buckets (6e6 parameters),
    were they used; with the links made free a collective costs its latency, so the exposed sync is the last
    block's reduce-scatter and the first block's gather, 2 x 15 ring steps (16 ranks over two nodes)."""
    from stageopt.frameworks.catalog import load_profile
    from stageopt.program import ProgramOptions, build_programs
    from stageopt.program.durations import collective_buckets
    from stageopt.sim.analytical import AnalyticalSimulator
    from stageopt.sim.run import hardware_for
    m = load_model("llama3-8b", ["layers=4"])
    plan = Plan.parse("tp=1 pp=1 dp=16 mbs=1 gbs=16 zero=2").replace(framework=load_profile(stack))
    assert plan.fsdp_step_sync == per_module
    work = build_workload(m, plan, 16)
    program = build_programs(work, ProgramOptions())[0]
    blocks = [n for n in program.nodes if n.phase == "dp" and n.group == "dp_cp" and n.comm_size > 4e8]
    assert blocks and all((collective_buckets(n, n.comm_size, plan) == 1) == per_module for n in blocks)
    if per_module:
        free = ["node.bandwidth_gbps=1e9", "scaleout.bandwidth_gbps=1e9", "gpu.efficiency.overlap_slowdown=0"]
        hw = dataclasses.replace(hardware_for("h100-sxm", free), nccl=None)
        exposed = AnalyticalSimulator().evaluate(work, hw).time_breakdown_s["exposed_dp_comm"]
        assert exposed == pytest.approx(2 * 15 * hw.tiers[1].latency_us * 1e-6, rel=1e-3)
