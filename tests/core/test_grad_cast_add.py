"""DeepSpeed's BF16_Optimizer adds every micro-batch's bf16 gradients into fp32 ones (grad_cast_add), by hand.

After each backward pass, ``hp_grad.add_(lp_grad.to(fp32))`` reads the 2-byte
gradient, writes a 4-byte copy, reads it and the 4-byte buffer and writes the
buffer: 18 bytes per parameter, one kernel per block. Without a pipeline an
iteration of m micro-batches therefore gains

    m * sum over blocks of (launch + 18 * params_block / (HBM bandwidth x memory fraction)).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.hardware import load_hardware
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for

STACKS = Path(__file__).resolve().parents[2] / "simulators" / "frameworks"
MODEL = ("gpt3-175b", ["layers=4", "hidden=2048", "heads=16", "kv_heads=16", "ffn=8192", "vocab=32000", "seq=2048"])
PLAN = "tp=1 pp=1 dp=2 mbs=1 gbs=8 zero=1 recompute=none dtype={}"


def stack_without_staging(tmp_path: Path) -> str:
    text = (STACKS / "megatron-deepspeed.yaml").read_text()
    assert "grad_cast_add: true" in text
    path = tmp_path / "no-staging.yaml"
    path.write_text(text.replace("grad_cast_add: true", "grad_cast_add: false")
                    .replace("name: megatron-deepspeed", "name: no-staging"))
    return str(path)


def run(framework: str, dtype: str = "bf16", simulator=None):
    return simulate_plan(MODEL[0], PLAN.format(dtype), None, framework=framework, model_set=MODEL[1],
                         hardware="a100-80g", simulator=simulator)[1]


def expected_extra_s() -> float:
    work = workload_for(MODEL[0], PLAN.format("bf16"), None, framework="megatron-deepspeed", model_set=MODEL[1])
    gpu = load_hardware("a100-80g").gpu
    eff = gpu.efficiency
    per_block = [eff.launch_us * 1e-6 + 18 * (work.value(k, "local_dense") + work.value(k, "local_expert"))
                 / (gpu.hbm_gbps * 1e9 * eff.memory_fraction)
                 for c in work.chunks[0] for k, n in c.blocks.items() for _ in range(n)]
    return work.plan.microbatches * sum(per_block)


@pytest.mark.parametrize("simulator", [None, ReplaySimulator()], ids=["analytical", "replay"])
def test_each_micro_batch_pays_18_bytes_a_parameter(tmp_path, simulator):
    staged, plain = run("megatron-deepspeed", simulator=simulator), run(stack_without_staging(tmp_path),
                                                                       simulator=simulator)
    assert staged.iteration_time_s - plain.iteration_time_s == pytest.approx(expected_extra_s(), rel=1e-3)
    assert staged.peak_memory_gib == pytest.approx(plain.peak_memory_gib, rel=1e-12)


def test_fp16_runs_and_megatron_stacks_do_not_stage(tmp_path):
    assert run("megatron-deepspeed", "fp16").iteration_time_s == pytest.approx(
        run(stack_without_staging(tmp_path), "fp16").iteration_time_s, rel=1e-12)
    work = workload_for(MODEL[0], PLAN.format("bf16"), None, framework="megatron-core", model_set=MODEL[1])
    assert work.plan.grad_staging_bytes == 0
