"""Sequence parallelism as DTensor runs it (torchtitan) vs as Megatron-LM runs it.

Megatron saves the 1/tp shard of each norm output the column-parallel projections
read, and all-gathers it again in backward. torchtitan's redistribution leaves
the gathered tensor to autograd, which keeps it whole and gathers nothing in
backward. A Llama layer has two such tensors (the inputs of QKV and of the gate
and up projections), so by hand it saves 2 x 2 bytes x s x h x (1 - 1/tp) more,
and its backward has two fewer tensor-parallel all-gathers per layer.
"""

from __future__ import annotations

import pytest

from stageopt.frameworks import load_profile
from stageopt.frameworks.catalog import PROFILES_DIR
from stageopt.graph.block import arch_of, build_block
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.model import load_model
from stageopt.parallel.plan import Plan


@pytest.fixture(scope="module")
def shard_saving_torchtitan(tmp_path_factory):
    text = (PROFILES_DIR / "torchtitan.yaml").read_text().replace("sp_saves_shard: false", "sp_saves_shard: true")
    path = tmp_path_factory.mktemp("profiles") / "torchtitan-shard.yaml"
    path.write_text(text)
    return load_profile(str(path))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_gathered_norm_outputs_are_kept_whole(t, shard_saving_torchtitan):
    model = load_model("llama3-8b", ["seq=4096"])

    def layer(profile):
        plan = Plan.parse(f"tp={t} sp=on mbs=1 recompute=none", framework=profile)
        arch = arch_of(model, plan)
        saved = compile_block("dense", arch, "none").evaluate(symbol_values(model, plan))["saved_bytes"]
        gathers = sum(1 for op in build_block("dense", arch, "none").bwd
                      if op.collective is not None and op.collective.kind == "all_gather")
        return float(saved), gathers

    (whole, gathers_whole), (shard, gathers_shard) = layer(load_profile("torchtitan")), layer(shard_saving_torchtitan)
    assert whole - shard == pytest.approx(2 * 2 * model.seq * model.hidden * (1 - 1 / t), rel=1e-9)
    assert gathers_shard - gathers_whole == 2
