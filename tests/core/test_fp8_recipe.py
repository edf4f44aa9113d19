"""FP8 casts priced per scaling recipe, checked against the kernels each recipe launches, by hand.

A cast before an FP8 GEMM reads the BF16 operand (2 bytes an element) and writes a row-wise and a column-wise
FP8 copy (1 + 1). Delayed scaling does that in one kernel (the amax taken in the same pass); current
("tensorwise") scaling first runs an amax kernel over the operand (2 more bytes read) and a scale kernel: three
kernels. MXFP8 writes an E8M0 scale for every 32 elements in each direction (2/32 more bytes). A grouped expert
GEMM casts its experts in one multi-tensor kernel under delayed scaling, one by one otherwise. An operand
all-gathered over TP for its GEMM is cast row-wise on each rank's shard (read 2, write 1), gathered in FP8 and
transposed whole (read 1, write 1) in one more kernel. So with HBM at ``bw`` bytes/s and ``L`` s a kernel:

    tensorwise - delayed = 2 L + 2 e / bw          (e elements cast)
    mxfp8 - delayed      = (2/32) e / bw
    experts (E of e each): tensorwise - delayed = (3E - 1) L + 2 E e / bw
    gathered over tp:    delayed = 2 L + (3 e/tp + 2 e) / bw,   not gathered: L + 4 e / bw
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import sympy as sp

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of, build_block
from stageopt.graph.symbols import ALL_SYMBOLS, symbol_values
from stageopt.hardware import load_hardware
from stageopt.hardware.kernels import LOWP_CAST, Kernels, kernel_seconds
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan

HW = load_hardware("h100-sxm")
LAUNCH = HW.gpu.efficiency.launch_us * 1e-6
BW = HW.gpu.hbm_gbps * 1e9 * HW.gpu.efficiency.memory_fraction


def gemm(m: int, n: int, k: int, batch: int = 1, cast: float | None = None) -> Kernels:
    """One forward FP8 GEMM that casts its activation operand (m x k per batch entry)."""
    return Kernels(code=np.array([0]), flops=np.array([2.0 * m * n * k * batch]),
                   nbytes=np.array([2.0 * (m * k + k * n + m * n) * batch]), m=np.array([m]), n=np.array([n]),
                   k=np.array([k]), batch=np.array([batch]), precision=np.array([LOWP_CAST]),
                   backward=np.array([False]), cast=None if cast is None else np.array([cast]))


def seconds(kern: Kernels, recipe: str, dtype: str = "fp8") -> float:
    return float(kernel_seconds(HW, dtype, kern, fp8_recipe=recipe)[0])


def test_current_scaling_reads_the_operand_once_more_in_two_more_kernels():
    m, n, k = 8192, 8192, 8192
    one = gemm(m, n, k)
    assert seconds(one, "tensorwise") - seconds(one, "delayed") == pytest.approx(2 * LAUNCH + 2 * m * k / BW)
    assert seconds(one, "mxfp8") - seconds(one, "delayed") == pytest.approx(2 / 32 * m * k / BW)


def test_experts_are_cast_one_by_one_except_under_delayed_scaling():
    m, n, k, experts = 4096, 1536, 2048, 8
    grouped = gemm(m, n, k, batch=experts)
    e = m * k
    assert seconds(grouped, "tensorwise") - seconds(grouped, "delayed") == pytest.approx(
        (3 * experts - 1) * LAUNCH + 2 * experts * e / BW)
    assert seconds(grouped, "mxfp8") - seconds(grouped, "delayed") == pytest.approx(
        (experts - 1) * LAUNCH + 2 / 32 * experts * e / BW)


def test_a_gathered_operand_is_cast_on_its_shard_and_transposed_whole():
    m, n, k, tp = 8192, 8192, 8192, 4
    e = m * k
    whole, shard = gemm(m, n, k), gemm(m, n, k, cast=e / tp)
    assert seconds(whole, "delayed") - seconds(shard, "delayed") == pytest.approx(
        (LAUNCH + 4 * e / BW) - (2 * LAUNCH + (3 * e / tp + 2 * e) / BW))
    # block-scaled copies are gathered in both directions: only the shard is cast
    assert seconds(whole, "mxfp8") - seconds(shard, "mxfp8") == pytest.approx((4 + 2 / 32) * (e - e / tp) / BW)


def test_the_recipe_changes_nothing_in_bf16():
    one = gemm(4096, 4096, 4096)
    assert seconds(one, "tensorwise", "bf16") == seconds(one, "delayed", "bf16")


def layer_ops(plan_text: str):
    """A Llama 3 8B layer's forward and backward ops under ``plan_text``, and a function giving an
    expression's value for that plan."""
    model = load_model("llama3-8b")
    plan = Plan.parse(plan_text)
    graph = build_block("dense", arch_of(model, plan), plan.recompute)
    values = symbol_values(model, SimpleNamespace(mbs=plan.mbs, tp=plan.tp, cp=plan.cp, ep=plan.ep, cpa=plan.cpa))
    args = [values[s.name] for s in ALL_SYMBOLS]
    return (*graph.fwd, *graph.bwd), lambda expr: float(sp.lambdify(ALL_SYMBOLS, expr)(*args))


def cast_rows(plan_text: str) -> list[tuple[str, float, float]]:
    """(op name, elements cast, m x k x batch) of every casting GEMM of a Llama layer under ``plan_text``."""
    ops, value = layer_ops(plan_text)
    out = []
    for op in ops:
        if op.kind == "matmul" and op.attrs.get("precision") == LOWP_CAST:
            m, _, k, batch, cast = (value(x) for x in op.attrs["gemm"])
            out.append((op.name, cast, m * k * batch))
    return out


def test_sequence_parallel_operands_are_cast_before_their_gather():
    model = load_model("llama3-8b")
    tokens, hidden = model.seq, model.hidden  # mbs 1
    rows = cast_rows("tp=4 sp=on dtype=fp8 recompute=none")
    gathered = [name for name, cast, full in rows if cast < full]
    assert {full for _, cast, full in rows if cast < full} == {tokens * hidden}  # the norm outputs and their grads
    assert all(cast == pytest.approx(full / 4) for _, cast, full in rows if cast < full)
    assert len(gathered) >= 4  # the attention and MLP inputs forward, their output gradients backward
    assert all(cast == full for _, cast, full in cast_rows("tp=4 sp=off dtype=fp8 recompute=none"))


def test_plans_name_their_recipe_and_stacks_default_it():
    assert Plan.parse("tp=1 dtype=fp8").fp8_recipe == "delayed"  # Megatron-Core's --fp8-recipe default
    assert Plan.parse("tp=1 dtype=fp8", framework=load_profile("torchtitan")).fp8_recipe == "tensorwise"
    plan = Plan.parse("tp=1 dtype=fp8 fp8_recipe=mxfp8")
    assert "fp8_recipe=mxfp8" in str(plan) and Plan.parse(str(plan)).fp8_recipe == "mxfp8"
    assert "fp8_recipe" not in str(Plan.parse("tp=1 dtype=fp8"))
    with pytest.raises(InfeasiblePlan, match="fp8_recipe.*delayed, tensorwise, mxfp8"):
        Plan.parse("tp=1 dtype=fp8 fp8_recipe=hybrid")


@pytest.mark.parametrize("simulator", [None, ReplaySimulator()], ids=["analytical", "replay"])
def test_both_backends_charge_the_recipe_alike(simulator):
    """One GPU, no communication, Megatron-Core's fused QKV and gate/up GEMMs: each layer casts four operands
    forward (x, the attention output, x, the SwiGLU output: s (2 h + q + f) elements) and four gradients
    backward (of the down projection, gate and up, the output projection, q/k/v: s (2 h + 2 f + q + 2 kv)),
    so per layer and micro-batch

        tensorwise - delayed = 8 x 2 L + 2 s (4 h + 2 q + 2 kv + 3 f) / bw."""
    s, layers, microbatches = 2048, 2, 4

    def step(recipe: str) -> float:
        plan = f"tp=1 pp=1 dp=1 mbs=1 gbs={microbatches} recompute=none dtype=fp8 fp8_recipe={recipe}"
        return simulate_plan("llama3-8b", plan, None, model_set=[f"layers={layers}", f"seq={s}"],
                             simulator=simulator)[1].iteration_time_s

    m = load_model("llama3-8b")
    q, kv = m.heads * m.dim_per_head, m.kv_heads * m.dim_per_head
    per_layer = 8 * 2 * LAUNCH + 2 * s * (4 * m.hidden + 2 * q + 2 * kv + 3 * m.ffn) / BW
    assert step("tensorwise") - step("delayed") == pytest.approx(microbatches * layers * per_layer, rel=1e-6)


def tp_gathers(plan_text: str) -> list[tuple[str, str, float, float]]:
    """(phase, gathered tensor, bytes a rank receives, elements gathered) of a Llama layer's TP all-gathers."""
    ops, value = layer_ops(plan_text)
    return [(op.phase, op.inputs[0].name, value(op.collective.output_bytes), value(op.outputs[0].local_numel()))
            for op in ops if op.kind == "comm" and op.collective.kind == "all_gather" and op.collective.axis == "tp"]


def test_the_gathers_feeding_fp8_gemms_move_one_byte_an_element():
    """Cast on the shard, the all-gather carries FP8: half the bytes of the same gather in BF16 training."""
    bf16 = tp_gathers("tp=4 sp=on dtype=bf16 recompute=none")
    fp8 = tp_gathers("tp=4 sp=on dtype=fp8 recompute=none")
    assert [g[:2] for g in bf16] == [g[:2] for g in fp8] and len(fp8) >= 4
    assert all(nbytes == 2 * numel for _, _, nbytes, numel in bf16)
    assert all(nbytes == numel for _, _, nbytes, numel in fp8)  # every TP gather of a layer feeds an FP8 GEMM
