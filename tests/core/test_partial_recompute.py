"""Partial full recompute (Megatron-Core's --recompute-method block --recompute-num-layers N), by hand.

Of each model chunk's layers, the first N are recomputed (they keep only their
input) and the rest store every activation. So a GPT layer saves 2sbh when
recomputed and sbh(34 + 5as/h) when stored (Korthikanti et al. 2022, Table 2,
for the paper's stack), and an iteration's compute is the stored layers' plus
the recomputed layers' (each layer's share of full recompute's extra forward).
"""

from __future__ import annotations

import pytest

from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.launch import launch_settings
from stageopt.model import load_model
from stageopt.model.layer_types import is_layer
from stageopt.parallel.plan import Plan
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for

S, B, H, A, L = 2048, 1, 12288, 96, 8  # GPT-3 175B's layer, 8 of them
GPT = ["layers=8"]


def layer_bytes_by_stage(plan: str) -> list[float]:
    """Saved bytes of the decoder layers each pipeline stage holds, one micro-batch."""
    work = workload_for("gpt3-175b", plan, None, model_set=GPT, framework="megatron-lm-2021")
    return [sum(n * work.value(k, "saved_bytes") for c in work.chunks[s] for k, n in c.blocks.items() if is_layer(k))
            for s in range(work.plan.pp)]


@pytest.mark.parametrize(("pp", "n"), [(1, 3), (2, 1), (2, 3)])
def test_the_first_n_layers_of_each_stage_keep_only_their_input(pp, n):
    per_stage = L // pp
    stored = S * B * H * (34 + 5 * A * S / H)
    want = n * 2 * S * B * H + (per_stage - n) * stored
    got = layer_bytes_by_stage(f"tp=1 pp={pp} mbs=1 gbs=8 recompute=full recompute_layers={n}")
    assert got == pytest.approx([want] * pp, rel=0.01)


def test_with_interleaving_the_count_is_per_virtual_stage():
    # pp 2 x vpp 2: four chunks of two layers, each recomputing its first layer: per stage 2 + 2 stored layers
    got = layer_bytes_by_stage("tp=1 pp=2 vpp=2 mbs=1 gbs=8 recompute=full recompute_layers=1 schedule=interleaved")
    want = 2 * 2 * S * B * H + 2 * S * B * H * (34 + 5 * A * S / H)
    assert got == pytest.approx([want, want], rel=0.01)


def recompute_flops(est) -> float:
    return (est.hardware_tflops_per_gpu - est.model_tflops_per_gpu) * est.iteration_time_s


def test_n_at_least_the_chunk_is_full_recompute_and_compute_is_linear_in_n():
    def run(extra: str):
        return simulate_plan("llama3-8b", f"tp=2 pp=1 dp=4 mbs=1 gbs=8 {extra}", None, hardware="h100-sxm",
                             model_set=GPT)[1]

    full, none = run("recompute=full"), run("recompute=none")
    assert run(f"recompute=full recompute_layers={L}").iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
    for n in (1, 4, 6):
        got = run(f"recompute=full recompute_layers={n}").time_breakdown_s["compute"]
        want = none.time_breakdown_s["compute"] + n / L * (full.time_breakdown_s["compute"]
                                                           - none.time_breakdown_s["compute"])
        assert got == pytest.approx(want, rel=1e-9)
        part = run(f"recompute=full recompute_layers={n}")  # hardware FLOPs count n of L layers' extra forward
        assert recompute_flops(part) == pytest.approx(n / L * recompute_flops(full), rel=1e-9)


def test_the_replay_runs_the_same_split():
    def both(plan: str) -> tuple[float, float]:
        run = [simulate_plan("llama3-8b", plan, None, hardware="h100-sxm", model_set=GPT, simulator=sim)[1]
               for sim in (None, ReplaySimulator())]
        return run[0].iteration_time_s, run[1].iteration_time_s

    base = "tp=2 pp=2 dp=2 mbs=1 gbs=8 recompute="
    (a_none, r_none), (a_full, r_full) = both(base + "none"), both(base + "full")
    a_half, r_half = both(base + "full recompute_layers=2")  # 2 of each stage's 4 layers
    assert r_half == pytest.approx(a_half, rel=0.05)
    assert (r_half - r_none) == pytest.approx((r_full - r_none) / 2, rel=0.05)
    assert (a_half - a_none) == pytest.approx((a_full - a_none) / 2, rel=0.05)


def test_plan_checks_and_megatrons_name():
    plan = Plan.parse("recompute=full recompute_num_layers=2")
    assert plan.recompute_layers == 2 and "recompute_layers=2" in str(plan)
    with pytest.raises(InfeasiblePlan, match="recompute_layers=2 .*set recompute=full"):
        Plan.parse("recompute=selective recompute_layers=2")
    with pytest.raises(InfeasiblePlan, match="'recompute_layers' must be a whole number"):
        Plan.parse("recompute=full recompute_layers=-1")


def test_exports_name_the_block_method():
    model = load_model("llama3-8b")
    plan = Plan.parse("tp=1 pp=1 dp=8 mbs=1 gbs=8 zero=3 recompute=full recompute_layers=16")
    megatron = launch_settings("megatron", model, plan).text
    assert "--recompute-method block" in megatron and "--recompute-num-layers 16" in megatron
    bridge = launch_settings("megatron-bridge", model, plan).text
    assert "model.recompute_method=block" in bridge and "model.recompute_num_layers=16" in bridge
    titan = launch_settings("torchtitan", model, plan.replace(framework=load_profile("torchtitan")))
    assert titan.settings["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    with pytest.raises(ConfigError, match="torchtitan checkpoints every k-th layer"):
        launch_settings("torchtitan", model, plan.replace(recompute_layers=5, framework=load_profile("torchtitan")))
