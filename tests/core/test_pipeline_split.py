"""Uneven pipeline stages as Megatron-Core builds them, in the workload, inspect and the analytical model."""

import numpy as np
import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.model import load_model
from stageopt.parallel.pipeline_split import parse_layout, split_layers
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload, stage_memory
from stageopt.workload.stats import stage_stats


def layers_per_rank(work) -> list[int]:
    return [sum(n for c in work.chunks[s] for k, n in c.blocks.items() if k in ("dense", "moe"))
            for s in range(work.plan.pp)]


def test_llama3_405b_pp16_interleaved_first_and_last_stage_one_layer_short():
    """Llama 3 report: 126 layers on pp16 with interleaving, first and last stage one layer fewer
    (Megatron-Core: --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)."""
    model = load_model("llama3-405b")
    plan = Plan.parse("tp=8 pp=16 vpp=2 schedule=interleaved embed_split=on loss_split=on mbs=1 gbs=2048",
                      gpus=16384)
    work = build_workload(model, plan, 16384)
    assert layers_per_rank(work) == [7] + [8] * 14 + [7]
    assert work.chunks[0][0].blocks == {"embedding": 1, "dense": 3}
    assert work.chunks[15][1].blocks == {"dense": 3, "head": 1}
    assert [c.virtual for c in work.chunks[3]] == [3, 19]


def test_first_and_last_layers_follow_megatron_offsets_with_interleaving():
    """--decoder-first/last-pipeline-num-layers with vpp: each chunk of rank 0 holds first/vpp layers,
    middle ranks share the rest; model stage k = vp_rank * pp + pp_rank (get_transformer_layer_offset)."""
    stages = split_layers(18, pp=4, vpp=2, first=4, last=2)
    assert [s.layers for s in stages] == [2, 3, 3, 1, 2, 3, 3, 1]
    offsets = np.cumsum([0] + [s.layers for s in stages])
    # Megatron: offset(pp_rank=2, vp_rank=1) = vp_rank * (4/2 + 12/2 + 2/2) + 4/2 + (2-1) * (12/2 // 2)
    assert offsets[1 * 4 + 2] == 1 * 9 + 2 + 1 * 3


def test_deepseek_v3_61_layers_on_pp16():
    model = load_model("deepseek-v3")
    work = build_workload(model, Plan.parse("pp=16 ep=8 last_layers=1 mbs=1 gbs=128", gpus=128), 128)
    assert layers_per_rank(work) == [4] * 15 + [1]
    assert work.chunks[0][0].blocks == {"embedding": 1, "dense": 3, "moe": 1}
    layout = build_workload(model, Plan.parse("pp=16 ep=8 layout=Ettt|(tttt|)*14,ttL mbs=1 gbs=128", gpus=128), 128)
    assert layers_per_rank(layout) == [3] + [4] * 14 + [2]
    assert layout.chunks[15][0].blocks == {"moe": 2, "head": 1}


def test_layout_string_unrolls_like_megatron():
    assert parse_layout("Et*3|(tt|)*2,t|L") == ["Ettt", "tt", "tt", "t", "L"]
    assert parse_layout("Et|tmL") == ["Et", "tmL"]  # m: a multi-token-prediction module
    with pytest.raises(InfeasiblePlan, match="unknown layer character"):
        parse_layout("Et|x|L")


@pytest.mark.parametrize("text, words", [
    ("pp=4 first_layers=3 embed_split=on", ["first_layers", "embed_split"]),
    ("pp=4 vpp=2 schedule=interleaved first_layers=5 last_layers=3", ["first_layers=5", "vpp=2"]),
    ("pp=4 first_layers=10 last_layers=9", ["middle"]),
    ("pp=4 embed_split=on", ["33", "pp*vpp"]),
    ("pp=2 layout=Et*10|t*10L", ["20", "layers=32"]),
    ("pp=2 layout=tEt*15|t*16L", ["first stage"]),
    ("pp=4 layout=Et*16|t*16L", ["pp*vpp"]),
])
def test_bad_splits_name_the_rule(text, words):
    model = load_model("llama3-8b")
    with pytest.raises(InfeasiblePlan) as err:
        build_workload(model, Plan.parse(text + " mbs=1 gbs=8"))
    for word in words:
        assert word in str(err.value)


def test_megatron_spellings_parse():
    plan = Plan.parse("pp=4 --decoder-first-pipeline-num-layers=6 decoder_last_pipeline_num_layers=6 mbs=1 gbs=8")
    assert (plan.first_layers, plan.last_layers) == (6, 6)
    assert "first_layers=6" in str(plan) and Plan.parse(str(plan)).first_layers == 6
    assert Plan.parse("pp=2 pipeline_model_parallel_layout=Et*16|t*16,L").layout == "Et*16|t*16,L"


@pytest.mark.parametrize("plan_text", [
    "tp=8 pp=16 vpp=2 schedule=interleaved embed_split=on loss_split=on mbs=1 gbs=1024",
    "tp=8 pp=8 first_layers=15 last_layers=15 mbs=1 gbs=512",
])
def test_analytical_stages_agree_with_the_workload(plan_text):
    """Per-stage memory and compute of the batch model equal the workload's stage by stage."""
    model = load_model("llama3-405b")
    plan = Plan.parse(plan_text, gpus=8192)
    work = build_workload(model, plan, 8192)
    hw = hardware_for("h100-sxm")
    res = evaluate_plans(model, hw, [plan])
    peak = max(stage_memory(work, s).total for s in range(plan.pp)) / 2**30
    assert res["mem_total"][0] == pytest.approx(peak, rel=1e-9)
    flops = [stage_stats(work, s).flops["fwd"] for s in range(plan.pp)]
    assert max(flops) > min(flops)  # the split really is uneven
