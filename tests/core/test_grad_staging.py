"""Gradient work between a block's backward and its reduction, priced as the kernels each stack launches, by hand.

DeepSpeed's BF16_Optimizer (``grad_cast_add``): after each backward pass ``hp_grad.add_(lp_grad.to(fp32))``
reads the 2-byte gradient, writes a 4-byte copy, reads it and the 4-byte buffer and writes the buffer: 18 bytes
a parameter. PyTorch FSDP v1 (``fsdp_copies: fsdp1``): ``flat_param.grad.to(reduce_dtype)`` reads the bf16
gradient and writes a copy in the reduce dtype (when it differs), then ``_div_if_needed`` reads and writes that
copy: 2 + 4 + 4 + 4 = 14 bytes with an fp32 reduce, 2 + 2 = 4 with a bf16 one. FSDP2 (``fsdp2``): each of the
two gathers' outputs is copied into the parameters (2 + 2 bytes each) and the gradients into the reduce-scatter
input (2 + 4 in fp32, 2 + 2 in bf16): 14 and 12 bytes under ZeRO-3, 10 under ZeRO-2. One kernel per block, so an
iteration of m micro-batches without a pipeline gains

    m * sum over blocks of (launch + bytes * params_block / (HBM bandwidth x memory fraction)).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.hardware import load_hardware
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for

STACKS = Path(__file__).resolve().parents[2] / "simulators" / "frameworks"
MODEL = ("gpt3-175b", ["layers=4", "hidden=2048", "heads=16", "kv_heads=16", "ffn=8192", "vocab=32000", "seq=2048"])
DEEPSPEED = ("megatron-deepspeed", "grad_cast_add", "a100-80g", "tp=1 pp=1 dp=2 mbs=1 gbs=8 zero=1 recompute=none")
FSDP = ("llm-foundry", "fsdp_copies", "h100-sxm",
        "tp=1 pp=1 dp=2 mbs=2 gbs=8 zero=3 recompute=none dp_overlap=off")


def stack_without(stack: str, field: str, tmp_path: Path) -> str:
    """The shipped profile ``stack`` with ``field`` turned off (``none`` for FSDP's copies), as a YAML file."""
    text = (STACKS / f"{stack}.yaml").read_text()
    on, off = {"fsdp_copies": ("fsdp_copies: fsdp", "fsdp_copies: none  # ")}.get(field, (f"{field}: true",
                                                                                          f"{field}: false"))
    assert on in text
    path = tmp_path / "without.yaml"
    path.write_text(text.replace(on, off, 1).replace(f"name: {stack}", "name: without"))
    return str(path)


def run(framework: str, hardware: str, plan: str, simulator=None):
    return simulate_plan(MODEL[0], plan, None, framework=framework, model_set=MODEL[1], hardware=hardware,
                         simulator=simulator)[1]


def expected_extra_s(stack: str, hardware: str, plan: str, nbytes: int) -> float:
    work = workload_for(MODEL[0], plan, None, framework=stack, model_set=MODEL[1])
    gpu = load_hardware(hardware).gpu
    eff = gpu.efficiency
    per_block = [eff.launch_us * 1e-6 + nbytes * (work.value(k, "local_dense") + work.value(k, "local_expert"))
                 / (gpu.hbm_gbps * 1e9 * eff.memory_fraction)
                 for c in work.chunks[0] for k, n in c.blocks.items() for _ in range(n)]
    return work.plan.microbatches * sum(per_block)


@pytest.mark.parametrize("simulator", [None, ReplaySimulator()], ids=["analytical", "replay"])
def test_deepspeed_pays_18_bytes_a_parameter_each_micro_batch(tmp_path, simulator):
    stack, field, hardware, plan = DEEPSPEED
    staged = run(stack, hardware, f"{plan} dtype=bf16", simulator)
    plain = run(stack_without(stack, field, tmp_path), hardware, f"{plan} dtype=bf16", simulator)
    assert staged.iteration_time_s - plain.iteration_time_s == pytest.approx(
        expected_extra_s(stack, hardware, f"{plan} dtype=bf16", 18), rel=1e-3)
    assert staged.peak_memory_gib == pytest.approx(plain.peak_memory_gib, rel=1e-12)


def test_fp16_runs_and_megatron_stacks_do_not_stage(tmp_path):
    stack, field, hardware, plan = DEEPSPEED
    assert run(stack, hardware, f"{plan} dtype=fp16").iteration_time_s == pytest.approx(
        run(stack_without(stack, field, tmp_path), hardware, f"{plan} dtype=fp16").iteration_time_s, rel=1e-12)
    for framework, zero in (("megatron-core", "zero=1"), ("megatron-core", "zero=3"), ("llm-foundry", "zero=1")):
        work = workload_for(MODEL[0], plan.replace("zero=1", zero), None, framework=framework, model_set=MODEL[1])
        assert work.plan.grad_staging_bytes == 0


@pytest.mark.parametrize(("grad_dtype", "nbytes"), [("fp32", 14), ("bf16", 4)])
def test_fsdp_casts_and_predivides_each_micro_batch(tmp_path, grad_dtype, nbytes):
    stack, field, hardware, plan = FSDP
    plan = f"{plan} grad_dtype={grad_dtype}"
    prepared, plain = run(stack, hardware, plan), run(stack_without(stack, field, tmp_path), hardware, plan)
    assert prepared.iteration_time_s - plain.iteration_time_s == pytest.approx(
        expected_extra_s(stack, hardware, plan, nbytes), rel=1e-3)


@pytest.mark.parametrize(("stack", "plan", "nbytes"), [
    ("torchtitan", "tp=1 pp=1 dp=2 mbs=2 gbs=8 zero=3 recompute=none dp_overlap=off", 14),
    ("torchtitan", "tp=1 pp=1 dp=2 mbs=2 gbs=8 zero=3 recompute=none dp_overlap=off grad_dtype=bf16", 12),
    ("torchtitan", "tp=1 pp=1 dp=2 mbs=2 gbs=8 zero=2 recompute=none dp_overlap=off", 10),
    ("torchtitan", "tp=1 pp=1 dp=2 mbs=2 gbs=8 zero=3 recompute=none dp_overlap=off grad_dtype=fp8", 11),
])
def test_fsdp2_copies_gathers_out_and_gradients_in(tmp_path, stack, plan, nbytes):
    copied, plain = run(stack, "h100-sxm", plan), run(stack_without(stack, "fsdp_copies", tmp_path), "h100-sxm", plan)
    assert copied.iteration_time_s - plain.iteration_time_s == pytest.approx(
        expected_extra_s(stack, "h100-sxm", plan, nbytes), rel=1e-3)


def test_torchtitan_under_a_pipeline_copies_once_a_step():
    work = workload_for(MODEL[0], "tp=1 pp=2 dp=2 mbs=1 gbs=8 zero=3 recompute=none", None, framework="torchtitan",
                        model_set=MODEL[1])
    assert work.plan.grad_staging_bytes == 0


@pytest.mark.parametrize(("grad_dtype", "nbytes"), [("fp32", 14), ("bf16", 4)])
def test_the_replay_hides_at_most_its_communication_waits(tmp_path, grad_dtype, nbytes):
    """The replay runs the same kernels on the compute stream; where the plain step waited for a ZeRO-3
    gather or scatter, the new kernels fill that wait, so the step grows by their time less at most the
    communication it had exposed."""
    stack, field, hardware, plan = FSDP
    plan = f"{plan} grad_dtype={grad_dtype}"
    prepared = run(stack, hardware, plan, ReplaySimulator())
    plain = run(stack_without(stack, field, tmp_path), hardware, plan, ReplaySimulator())
    grown, expected = prepared.iteration_time_s - plain.iteration_time_s, expected_extra_s(stack, hardware, plan,
                                                                                          nbytes)
    assert expected - plain.time_breakdown_s["exposed_dp_comm"] <= grown <= expected * (1 + 1e-3)


@pytest.mark.parametrize(("stack", "zeros"), [("torchtitan", (1, 2, 3)), ("megatron-deepspeed", (1, 2))])
def test_a_search_batch_prices_each_plan_as_alone(stack, zeros):
    """The search scores many plans in one batch; plans whose copies differ (by ZeRO stage) must not share
    one plan's bytes."""
    plans = [f"tp=1 pp=1 dp=2 mbs=1 gbs=8 zero={z} recompute=none" for z in zeros]
    works = [workload_for(MODEL[0], p, None, framework=stack, model_set=MODEL[1]) for p in plans]
    model, hw = works[0].model, load_hardware("h100-sxm")
    together = evaluate_plans(model, hw, [w.plan for w in works])["iteration_time_s"]
    alone = [evaluate_plans(model, hw, [w.plan])["iteration_time_s"][0] for w in works]
    assert list(together) == pytest.approx(alone, rel=1e-12)
    assert len({w.plan.grad_staging_bytes for w in works}) == len(zeros)
