"""Megatron-Core's selective recompute by module (``recompute_modules``), checked against hand counts.

Per DeepSeek-V3 layer and micro-batch of T tokens (tp=1): ``mla_up_proj`` re-runs the query and key/value
up-projections, 2T(q_lora x heads x (nope + rope) + 2 x kv_lora x heads x 128) FLOPs, and no longer stores
their outputs; ``layernorm`` drops the two norm outputs (2 x T x h x 2 bytes); ``moe_act`` drops the experts'
activation output (T x top_k x expert_ffn x 2 bytes); ``mlp`` re-runs a dense layer's MLP (its three GEMMs).
"""

from __future__ import annotations

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload

T, H = 1024, 7168
MODEL = load_model("deepseek-v3", ["layers=4", "dense_layers=1", f"seq={T}"])


def _values(kind: str, modules: str = "") -> dict[str, float]:
    text = "tp=1 mbs=1 gbs=1" + (f" recompute=selective recompute_modules={modules}" if modules else "")
    plan = Plan.parse(text)
    block = compile_block(kind, arch_of(MODEL, plan), plan.recompute).evaluate(symbol_values(MODEL, plan))
    return {k: float(v) for k, v in block.items()}


def test_mla_up_proj_reruns_the_up_projections() -> None:
    up = 2 * T * (1536 * 128 * (128 + 64) + 2 * 512 * 128 * 128)
    assert _values("moe", "mla_up_proj")["recompute_flops"] == pytest.approx(up, rel=1e-3)  # norms, RoPE apart
    assert _values("moe", "mla_up_proj")["saved_bytes"] < _values("moe")["saved_bytes"]


def test_layernorm_and_moe_act_drop_exactly_their_outputs() -> None:
    plain = _values("moe")["saved_bytes"]
    assert plain - _values("moe", "layernorm")["saved_bytes"] == pytest.approx(2 * T * H * 2)
    assert plain - _values("moe", "moe_act")["saved_bytes"] == pytest.approx(T * 8 * 2048 * 2)


def test_mlp_reruns_a_dense_layers_mlp_and_leaves_moe_layers_alone() -> None:
    dense = _values("dense", "mlp")["recompute_flops"]
    assert dense == pytest.approx(2 * T * 3 * H * 18432, rel=1e-3)  # gate, up and down GEMMs of ffn 18432
    assert _values("moe", "mlp")["recompute_flops"] == 0


def test_module_names_are_checked_and_need_selective_on_megatron() -> None:
    assert Plan.parse("recompute=selective recompute_modules=mlp+mla_up_proj").recompute_modules == "mla_up_proj+mlp"
    with pytest.raises(InfeasiblePlan, match="at most once"):
        Plan.parse("recompute=selective recompute_modules=attention")
    with pytest.raises(InfeasiblePlan, match="set recompute=selective"):
        Plan.parse("recompute=full recompute_modules=mlp")
    with pytest.raises(InfeasiblePlan, match="drop recompute_modules"):
        Plan.parse("recompute=selective recompute_modules=mlp", framework=load_profile("torchtitan"))


def test_replay_and_analytical_agree_with_recomputed_moe_layers() -> None:
    """Re-running the whole MoE layer re-runs its all-to-alls too: both backends charge the same."""
    hw = load_hardware("h100-sxm")
    plan = Plan.parse("dp=8 ep=8 mbs=1 gbs=8 recompute=selective recompute_modules=moe dp_overlap=off")
    work = build_workload(MODEL, plan, 8)
    analytical = AnalyticalSimulator().evaluate(work, hw)
    replay = ReplaySimulator().evaluate(work, hw)
    assert replay.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.02)
    plain = AnalyticalSimulator().evaluate(build_workload(MODEL, plan.replace(recompute_modules="core_attn"), 8), hw)
    assert analytical.iteration_time_s > plain.iteration_time_s
