"""PyTorch FSDP (v1) casts and pre-divides every unit's unsharded gradient before its reduce-scatter, by hand.

``flat_param.grad.to(reduce_dtype)`` reads the bf16 gradient and writes a copy in the reduce dtype (when it
differs); ``_div_if_needed(padded_unsharded_grad, predivide_factor)`` reads and writes that copy. Per
parameter and micro-batch: 2 + 4 + 4 + 4 = 14 bytes with an fp32 reduce, 2 + 2 = 4 with a bf16 one. One
kernel per block, so an iteration of m micro-batches without a pipeline gains

    m * sum over blocks of (launch + bytes * params_block / (HBM bandwidth x memory fraction)).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.hardware import load_hardware
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for

STACKS = Path(__file__).resolve().parents[2] / "simulators" / "frameworks"
MODEL = ("gpt3-175b", ["layers=4", "hidden=2048", "heads=16", "kv_heads=16", "ffn=8192", "vocab=32000", "seq=2048"])
PLAN = "tp=1 pp=1 dp=2 mbs=2 gbs=8 zero=3 recompute=none dp_overlap=off"


def stack_without_prep(tmp_path: Path) -> str:
    text = (STACKS / "llm-foundry.yaml").read_text()
    assert "fsdp_grad_prep: true" in text
    path = tmp_path / "no-prep.yaml"
    path.write_text(text.replace("fsdp_grad_prep: true", "fsdp_grad_prep: false")
                    .replace("name: llm-foundry", "name: no-prep"))
    return str(path)


def run(framework: str, plan: str = PLAN, simulator=None):
    return simulate_plan(MODEL[0], plan, None, framework=framework, model_set=MODEL[1], hardware="h100-sxm",
                         simulator=simulator)[1]


def expected_extra_s(nbytes: int, plan: str = PLAN) -> float:
    work = workload_for(MODEL[0], plan, None, framework="llm-foundry", model_set=MODEL[1])
    gpu = load_hardware("h100-sxm").gpu
    eff = gpu.efficiency
    per_block = [eff.launch_us * 1e-6 + nbytes * (work.value(k, "local_dense") + work.value(k, "local_expert"))
                 / (gpu.hbm_gbps * 1e9 * eff.memory_fraction)
                 for c in work.chunks[0] for k, n in c.blocks.items() for _ in range(n)]
    return work.plan.microbatches * sum(per_block)


@pytest.mark.parametrize(("grad_dtype", "nbytes"), [("fp32", 14), ("bf16", 4)])
def test_each_micro_batch_pays_the_cast_and_the_predivide(tmp_path, grad_dtype, nbytes):
    plan = f"{PLAN} grad_dtype={grad_dtype}"
    prepared, plain = run("llm-foundry", plan), run(stack_without_prep(tmp_path), plan)
    assert prepared.iteration_time_s - plain.iteration_time_s == pytest.approx(expected_extra_s(nbytes, plan),
                                                                               rel=1e-3)


@pytest.mark.parametrize(("grad_dtype", "nbytes"), [("fp32", 14), ("bf16", 4)])
def test_the_replay_hides_at_most_its_communication_waits(tmp_path, grad_dtype, nbytes):
    """The replay runs the same kernels on the compute stream; where the plain step waited for a ZeRO-3
    gather or scatter, the new kernels fill that wait, so the step grows by their time less at most the
    communication it had exposed."""
    plan = f"{PLAN} grad_dtype={grad_dtype}"
    prepared = run("llm-foundry", plan, ReplaySimulator())
    plain = run(stack_without_prep(tmp_path), plan, ReplaySimulator())
    grown, expected = prepared.iteration_time_s - plain.iteration_time_s, expected_extra_s(nbytes, plan)
    assert expected - plain.time_breakdown_s["exposed_dp_comm"] <= grown <= expected * (1 + 1e-3)


def test_only_sharded_gradients_are_prepared():
    work = workload_for(MODEL[0], PLAN.replace("zero=3", "zero=1"), None, framework="llm-foundry",
                        model_set=MODEL[1])
    assert work.plan.grad_staging_bytes == 0
    megatron = workload_for(MODEL[0], PLAN, None, framework="megatron-core", model_set=MODEL[1])
    assert megatron.plan.grad_staging_bytes == 0
