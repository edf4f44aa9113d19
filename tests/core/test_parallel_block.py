"""Parallel attention + MLP blocks (GPT-J, PaLM, GPT-NeoX, Falcon, MegaScale) vs hand counts.

A sequential layer reduces over TP twice each way (after attention, after the MLP). A parallel block sums the
two row-parallel partial outputs locally and reduces once: per layer one all-reduce forward and one backward
without SP; with SP one all-gather of the shared norm's output (two with two norms) and one reduce-scatter.
The GEMMs are the same, so FLOPs are equal, and a shared norm drops one norm's parameters per layer.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from stageopt.cli import main
from stageopt.errors import ConfigError
from stageopt.frameworks import load_profile
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload
from stageopt.workload.stats import stage_stats

GPT_NEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64, "num_hidden_layers": 44,
                "intermediate_size": 24576, "vocab_size": 50432, "max_position_embeddings": 2048, "rotary_pct": 0.25,
                "use_parallel_residual": True, "tie_word_embeddings": False}
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
             "vocab_size": 65024, "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False,
             "bias": False, "alibi": False}
FALCON_180B = {"model_type": "falcon", "hidden_size": 14848, "num_attention_heads": 232, "num_kv_heads": 8,
               "num_hidden_layers": 80, "vocab_size": 65024, "new_decoder_architecture": True,
               "parallel_attn": True, "bias": False, "alibi": False}


def tp_uses(block: str, plan: str, layers: int = 4) -> dict[tuple[str, str], int]:
    """Count of TP collectives of one b*s*h bf16 buffer per (kind, phase) on stage 0."""
    model = load_model("llama3-8b", [f"layers={layers}", f"parallel_block={block}"])
    work = build_workload(model, Plan.parse(plan))
    buf = model.seq * model.hidden * 2
    counts: dict[tuple[str, str], int] = {}
    for c in stage_stats(work, 0).collectives:
        if c.group == "tp" and c.bytes_each == buf:
            counts[(c.kind, c.phase)] = counts.get((c.kind, c.phase), 0) + c.count
    return counts


def test_one_all_reduce_each_way_per_layer_without_sp():
    layers = 4
    seq = tp_uses("off", "tp=4 mbs=1 gbs=1 sp=off recompute=none", layers)
    par = tp_uses("shared_norm", "tp=4 mbs=1 gbs=1 sp=off recompute=none", layers)
    assert seq[("all_reduce", "fwd")] == 2 * layers + 1  # + the embedding's
    assert par[("all_reduce", "fwd")] == layers + 1
    assert seq[("all_reduce", "bwd")] == 2 * layers + 1  # + the output layer's input gradient
    assert par[("all_reduce", "bwd")] == layers + 1


@pytest.mark.parametrize("block, gathers", [("shared_norm", 1), ("two_norms", 2)])
def test_sequence_parallel_gathers_each_norm_output_once_and_scatters_once(block, gathers):
    layers = 4
    par = tp_uses(block, "tp=4 mbs=1 gbs=1 sp=on recompute=none", layers)
    assert par[("all_gather", "fwd")] == gathers * layers + 1  # + before the output layer
    assert par[("reduce_scatter", "fwd")] == layers + 1  # + after the embedding


def test_same_flops_and_one_norm_fewer_parameters_per_layer():
    plan = Plan.parse("tp=1")
    works = {b: build_workload(load_model("gpt3-175b", ["layers=6", f"parallel_block={b}"]), plan)
             for b in ("off", "shared_norm", "two_norms")}
    for phase in ("fwd", "bwd"):  # GEMM and attention FLOPs (elementwise work is counted apart)
        flops = {b: stage_stats(w, 0).flops[phase] for b, w in works.items()}
        assert flops["shared_norm"] == flops["off"] == flops["two_norms"]
    hidden = 12288
    assert works["two_norms"].params_total == works["off"].params_total
    assert works["off"].params_total - works["shared_norm"].params_total == 6 * 2 * hidden  # LayerNorm g and b


@pytest.mark.parametrize("simulator", [AnalyticalSimulator(), ReplaySimulator()], ids=["analytical", "replay"])
def test_exposed_tp_time_per_layer_halves(simulator):
    """Unhidden TP time: two more layers add 8 equal all-reduces sequentially, 4 in parallel blocks."""
    stack = dataclasses.replace(load_profile("megatron-core"), tp_async_backward=False, name="megatron-core-sync")

    def exposed(block: str, layers: int) -> float:
        model = load_model("llama3-8b", [f"layers={layers}", f"parallel_block={block}"])
        plan = Plan.parse("tp=4 mbs=1 gbs=1 sp=off tp_overlap=off recompute=none", framework=stack)
        result = simulator.evaluate(build_workload(model, plan), hardware_for("h100-sxm"))
        return result.time_breakdown_s["exposed_tp_comm"]

    per_two_sequential = exposed("off", 4) - exposed("off", 2)
    per_two_parallel = exposed("shared_norm", 4) - exposed("shared_norm", 2)
    assert per_two_sequential > 0
    assert per_two_parallel == pytest.approx(per_two_sequential / 2, rel=1e-6)


def _hf(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_gpt_neox_20b_from_its_config_matches_the_closed_form(tmp_path):
    """Untied embeddings; per layer 12h^2 weights, 9h biases (QKV 3h, output h, fc1 4h, fc2 h) and two
    LayerNorms (4h); a final LayerNorm: 20,554,567,680 parameters."""
    model = load_model(_hf(tmp_path, GPT_NEOX_20B))
    assert (model.parallel_block, model.norm, model.bias, model.seq) == ("two_norms", "layernorm", True, 2048)
    h, layers, vocab = 6144, 44, 50432
    closed = layers * (12 * h * h + 9 * h + 4 * h) + 2 * vocab * h + 2 * h
    assert closed == 20_554_567_680
    assert build_workload(model, Plan.parse("tp=1")).params_total == closed


def test_falcon_configs_map_their_norms_and_key_value_heads(tmp_path):
    """Falcon-7B: multi-query (one K/V head), one shared LayerNorm, tied embeddings, no biases; per layer
    QKV h(h + 2*64), dense h^2, MLP 8h^2 and one LayerNorm (2h): 6,921,720,704 parameters."""
    seven = load_model(_hf(tmp_path, FALCON_7B))
    assert (seven.kv_heads, seven.parallel_block, seven.tied_embeddings) == (1, "shared_norm", True)
    h, layers, vocab = 4544, 32, 65024
    closed = layers * (h * (h + 2 * 64) + h * h + 8 * h * h + 2 * h) + vocab * h + 2 * h
    assert closed == 6_921_720_704
    assert build_workload(seven, Plan.parse("tp=1")).params_total == closed
    big = load_model(_hf(tmp_path, FALCON_180B))
    assert (big.kv_heads, big.parallel_block, big.ffn) == (8, "two_norms", 4 * 14848)


def test_a_parallel_block_with_experts_is_refused():
    with pytest.raises(ConfigError, match="parallel_block=shared_norm .* experts"):
        load_model("mixtral-8x7b", ["parallel_block=shared_norm"])


def test_serving_prices_the_mlp_half_without_its_own_norm_under_a_shared_norm():
    """Serving prices a layer as an attention half and an MLP half, each all-reducing its own output (as vLLM's
    Cohere and GPT-NeoX layers run): a shared norm drops the MLP half's norm and nothing else."""
    from stageopt.serving.cache_graph import inference_arch, serving_block

    def mlp_ops(block: str):
        model = load_model("llama3-8b", [f"parallel_block={block}"])
        return serving_block("mlp", inference_arch(model, 2)).ops

    sequential, shared, two = mlp_ops("off"), mlp_ops("shared_norm"), mlp_ops("two_norms")
    norm_ops = [op.name for op in sequential if "ln2" in op.name]
    assert norm_ops and not [op for op in shared if "ln2" in op.name]
    assert [op.name for op in two] == [op.name for op in sequential]
    gemm_flops = [sum(op.flops for op in ops if op.kind == "matmul") for ops in (sequential, shared)]
    assert gemm_flops[0] == gemm_flops[1]


def test_serve_runs_a_parallel_block_model(capsys):
    code = main(["serve", "--model", "llama3-8b", "--set", "parallel_block=shared_norm", "--plan", "tp=2",
                 "--traffic", "rate=4 input=1024 output=256 requests=100", "--no-sim", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["analytical"]["tpot_ms"] > 0


def test_export_refuses_a_parallel_block_no_target_builds(capsys):
    code = main(["export", "--model", "gpt-neox-20b", "--plan", "tp=2 pp=4 dp=12 mbs=4 gbs=1536", "--gpus", "96"])
    err = capsys.readouterr().err
    assert code == 2 and "parallel_block=two_norms" in err and len(err.strip().splitlines()) == 1
