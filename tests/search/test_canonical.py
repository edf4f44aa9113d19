"""Each canonical rule merges plans whose numbers are provably identical: checked on the analytical model
and on the event replay, through the path users run (``simulate_plan``)."""

from __future__ import annotations

import itertools

import pytest

from stageopt.errors import StageoptError
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.census import take_census
from stageopt.search.space import load_space, space_from_dict
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan

BASE = "mbs=1 gbs=32 zero=1 sp=on dp_overlap=on"
# (rule, plan a, plan b): b is what the canonical form of a says it is; llama3-8b (flash attention) on 16 GPUs.
# Rule 1 (vpp ignored without interleaving) is enforced by Plan itself, which refuses vpp > 1 then.
PAIRS = [
    ("one micro-batch: GPipe is 1F1B", "tp=2 pp=2 mbs=4 gbs=16 schedule=gpipe framework=torchtitan",
     "tp=2 pp=2 mbs=4 gbs=16 schedule=1f1b framework=torchtitan"),
    ("tp=1: no TP overlap", f"tp=1 pp=2 tp_overlap=on {BASE}", f"tp=1 pp=2 tp_overlap=off {BASE}"),
    ("pp=1: no uneven split", f"tp=2 pp=1 embed_split=on loss_split=on {BASE}", f"tp=2 pp=1 {BASE}"),
    ("no shared experts: no MoE overlap", f"tp=2 pp=2 moe_overlap=on {BASE}", f"tp=2 pp=2 moe_overlap=off {BASE}"),
    ("recompute_layers >= layers: every layer", f"tp=2 pp=2 recompute=full recompute_layers=32 {BASE}",
     f"tp=2 pp=2 recompute=full {BASE}"),
    ("bf16: no FP8 recipe", f"tp=2 pp=2 dtype=bf16 fp8_recipe=tensorwise {BASE}", f"tp=2 pp=2 dtype=bf16 {BASE}"),
    ("micro-batch groups of pp are the default", f"tp=2 pp=2 vpp=2 schedule=interleaved vpp_group=2 {BASE}",
     f"tp=2 pp=2 vpp=2 schedule=interleaved {BASE}"),
]
# Rule 15's other half (vpp_group without interleaving) is refused by Plan itself, as rule 1's vpp is.
# Rule 8 (cp_comm with cp=1) is enforced by Plan itself, which resets it (tests/core/test_cp_variants.py).


@pytest.mark.parametrize("rule, a, b", PAIRS, ids=[p[0] for p in PAIRS])
def test_merged_plans_simulate_identically(rule: str, a: str, b: str) -> None:
    for simulator in (None, ReplaySimulator()):
        _, ea = simulate_plan("llama3-8b", a, 16, model_set=["seq=4096"], simulator=simulator)
        _, eb = simulate_plan("llama3-8b", b, 16, model_set=["seq=4096"], simulator=simulator)
        assert ea.iteration_time_s == pytest.approx(eb.iteration_time_s, rel=1e-12), rule
        assert ea.peak_memory_gib == pytest.approx(eb.peak_memory_gib, rel=1e-12), rule


def test_selective_differs_from_none_with_eager_attention() -> None:
    """The flash rule must not fire where it is false: eager attention stores the score matrix."""
    plan = f"tp=2 pp=2 {BASE}"
    _, sel = simulate_plan("llama3-8b", plan + " recompute=selective", 16, model_set=["seq=4096", "attention=eager"],
                           framework="megatron-lm-2021")
    _, none = simulate_plan("llama3-8b", plan + " recompute=none", 16, model_set=["seq=4096", "attention=eager"],
                            framework="megatron-lm-2021")
    assert sel.peak_memory_gib < none.peak_memory_gib


def test_selective_is_kept_where_the_stack_reruns_ops_with_flash_attention() -> None:
    """Selective checkpointing costs time even with flash attention: torchtitan's op-level policy re-runs
    matmuls and elementwise ops, Megatron-Core re-runs the fused attention kernel. Never merged into none."""
    from stageopt.frameworks import load_profile
    from stageopt.model import load_model
    from stageopt.search.candidate import canonical
    from stageopt.search.dimensions import PLAN_DEFAULTS
    values = {**PLAN_DEFAULTS, "tp": 2, "pp": 2, "recompute": "selective", "gbs": 32}
    model = load_model("llama3-8b")
    assert canonical(values, 16, model, load_profile("torchtitan"))["recompute"] == "selective"
    assert canonical(values, 16, model, load_profile("megatron-core"))["recompute"] == "selective"
    plan = f"tp=2 pp=2 {BASE}"
    _, sel = simulate_plan("llama3-8b", plan + " recompute=selective", 16, model_set=["seq=4096"], framework="torchtitan")
    _, none = simulate_plan("llama3-8b", plan + " recompute=none", 16, model_set=["seq=4096"], framework="torchtitan")
    assert sel.iteration_time_s > none.iteration_time_s and sel.peak_memory_gib < none.peak_memory_gib
    _, sel = simulate_plan("llama3-8b", plan + " recompute=selective", 16, model_set=["seq=4096"])
    _, none = simulate_plan("llama3-8b", plan + " recompute=none", 16, model_set=["seq=4096"])
    assert sel.iteration_time_s > none.iteration_time_s


@pytest.mark.parametrize("name", ["default", "mixtral-ep", "llama3-405b-cp"])
def test_census_equals_one_candidate_per_combination(name: str) -> None:
    """The vectorized enumeration keeps exactly the canonical candidates the plain per-combination path builds."""
    space = load_space(name)
    catalog = HardwareCatalog(space)
    keys, valid = set(), 0
    for combo in itertools.product(*[d.values for d in space.dims]):
        try:
            keys.add(make_candidate(space, catalog, space.complete(dict(zip([d.name for d in space.dims], combo)))).key)
            valid += 1
        except StageoptError:
            continue
    census = take_census(space, catalog)
    assert {c.key for c in census.cands} == keys
    # every combination is a kept candidate, a restatement of an earlier one, or breaks a named rule
    assert len(census) + census.merged + sum(census.invalid_reasons.values()) == space.size()
    assert sum(census.invalid_reasons.values()) <= space.size() - valid


def test_interleaved_with_one_chunk_runs_as_1f1b_and_is_never_better() -> None:
    """Rule 2 is definitional (interleaving needs vpp > 1); the plan it maps to has the same time, less memory."""
    a, b = f"tp=2 pp=2 vpp=1 schedule=interleaved {BASE}", f"tp=2 pp=2 vpp=1 schedule=1f1b {BASE}"
    _, ea = simulate_plan("llama3-8b", a, 16, model_set=["seq=4096"])
    _, eb = simulate_plan("llama3-8b", b, 16, model_set=["seq=4096"])
    assert eb.iteration_time_s == pytest.approx(ea.iteration_time_s, rel=1e-12)
    assert eb.peak_memory_gib <= ea.peak_memory_gib


def test_zero_without_data_or_context_parallelism_is_zero_0() -> None:
    """Rule 5: with dp*cp = 1 there is nothing to shard; the choice maps to zero=0 instead of being refused."""
    space = space_from_dict({"model": "llama3-8b", "cluster": {"gpus": [16, 32]}, "training": {"global_batch": 8},
                             "plan": {"tp": 4, "pp": 4, "cp": [1, 2], "zero": [0, 2], "sp": "on"}}, where="z")
    cat = HardwareCatalog(space)
    base = space.complete({"gpus": 16, "cp": 1, "zero": 2})
    assert make_candidate(space, cat, base).key == make_candidate(space, cat, {**base, "zero": 0}).key
    assert make_candidate(space, cat, base).plan.zero == 0
    cp2 = make_candidate(space, cat, {**base, "gpus": 32, "cp": 2})  # dp=1 but cp=2: ZeRO shards over cp, kept
    assert cp2.plan.zero == 2


def test_uneven_split_with_pp_1_is_the_even_plan_not_an_error() -> None:
    """Rule 3: first/last-stage layer counts mean nothing without a pipeline (Plan refuses them with pp=1);
    the choice maps to the unset split, so a space crossing pp with first_layers keeps its pp=1 plans."""
    space = space_from_dict({"model": "llama3-8b", "cluster": {"gpus": 16}, "training": {"global_batch": 32},
                             "plan": {"tp": 2, "pp": [1, 2], "first_layers": [0, 15], "sp": "on"}}, where="u")
    cat = HardwareCatalog(space)
    flat = make_candidate(space, cat, space.complete({"pp": 1, "first_layers": 15}))
    assert flat.key == make_candidate(space, cat, space.complete({"pp": 1, "first_layers": 0})).key
    assert make_candidate(space, cat, space.complete({"pp": 2, "first_layers": 15})).plan.first_layers == 15


def test_hybrid_sharding_over_all_of_dp_or_without_zero_is_the_plain_plan() -> None:
    """Rule 10: dp_shard >= dp is sharding over all of dp (Plan resets dp_shard=dp itself and the merged
    plans simulate identically on both backends); with zero=0 nothing is sharded."""
    from stageopt.frameworks import load_profile
    from stageopt.model import load_model
    from stageopt.search.candidate import canonical
    from stageopt.search.dimensions import PLAN_DEFAULTS
    model, stack = load_model("llama3-8b"), load_profile("megatron-core")
    values = {**PLAN_DEFAULTS, "tp": 2, "pp": 2, "gbs": 32, "zero": 1}
    assert canonical({**values, "dp_shard": 8}, 16, model, stack)["dp_shard"] == 0  # dp = 4
    assert canonical({**values, "dp_shard": 2}, 16, model, stack)["dp_shard"] == 2
    assert canonical({**values, "dp_shard": 2, "zero": 0}, 16, model, stack)["dp_shard"] == 0
    for simulator in (None, ReplaySimulator()):
        _, ea = simulate_plan("llama3-8b", f"tp=2 pp=2 dp_shard=4 {BASE}", 16, model_set=["seq=4096"],
                              simulator=simulator)
        _, eb = simulate_plan("llama3-8b", f"tp=2 pp=2 {BASE}", 16, model_set=["seq=4096"], simulator=simulator)
        assert ea.iteration_time_s == pytest.approx(eb.iteration_time_s, rel=1e-12)
        assert ea.peak_memory_gib == pytest.approx(eb.peak_memory_gib, rel=1e-12)


def test_expert_tp_on_a_dense_model_is_the_plain_plan() -> None:
    """Rule 11: a dense model has no routed experts, so etp changes nothing (both backends agree)."""
    from stageopt.frameworks import load_profile
    from stageopt.model import load_model
    from stageopt.search.candidate import canonical
    from stageopt.search.dimensions import PLAN_DEFAULTS
    values = {**PLAN_DEFAULTS, "tp": 2, "pp": 2, "gbs": 32, "etp": 1}
    assert canonical(values, 16, load_model("llama3-8b"), load_profile("megatron-core"))["etp"] == 0
    assert canonical(values, 16, load_model("mixtral-8x7b"), load_profile("megatron-core"))["etp"] == 1
    for simulator in (None, ReplaySimulator()):
        _, ea = simulate_plan("llama3-8b", f"tp=2 pp=2 etp=1 {BASE}", 16, model_set=["seq=4096"], simulator=simulator)
        _, eb = simulate_plan("llama3-8b", f"tp=2 pp=2 {BASE}", 16, model_set=["seq=4096"], simulator=simulator)
        assert ea.iteration_time_s == pytest.approx(eb.iteration_time_s, rel=1e-12)
        assert ea.peak_memory_gib == pytest.approx(eb.peak_memory_gib, rel=1e-12)


def test_named_recompute_modules_are_not_merged_into_none() -> None:
    """Megatron's selective recompute of named modules re-runs them, core_attn included, even with flash
    attention; without selective recompute the module list means nothing and is dropped."""
    from stageopt.frameworks import load_profile
    from stageopt.model import load_model
    from stageopt.search.candidate import canonical
    from stageopt.search.dimensions import PLAN_DEFAULTS
    model, core = load_model("llama3-8b"), load_profile("megatron-core")
    base = {**PLAN_DEFAULTS, "tp": 2, "pp": 2, "gbs": 32}
    kept = canonical({**base, "recompute": "selective", "recompute_modules": "layernorm"}, 16, model, core)
    assert (kept["recompute"], kept["recompute_modules"]) == ("selective", "layernorm")
    core_attn = canonical({**base, "recompute": "selective", "recompute_modules": "core_attn"}, 16, model, core)
    assert (core_attn["recompute"], core_attn["recompute_modules"]) == ("selective", "core_attn")
    dropped = canonical({**base, "recompute": "full", "recompute_modules": "layernorm"}, 16, model, core)
    assert (dropped["recompute"], dropped["recompute_modules"]) == ("full", "")
