"""The spaces with the new plan choices: uneven splits, zero-bubble and DualPipe schedules, a framework."""

from __future__ import annotations

import pytest

from stageopt.errors import ConfigError
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.space import load_space, space_from_dict


def test_published_llama3_layout_is_a_candidate() -> None:
    """Llama 3 405B on 16K GPUs: tp8 cp1 pp16 dp128, interleaved, first and last stage one layer short."""
    space = load_space("llama3-405b-16k")
    cand = make_candidate(space, HardwareCatalog(space), space.complete(
        {"tp": 8, "pp": 16, "cp": 1, "vpp": 2, "mbs": 1, "recompute": "selective", "schedule": "interleaved",
         "embed_split": True, "loss_split": True}))
    assert (cand.plan.dp, cand.plan.embed_split, cand.plan.framework.name) == (128, True, "megatron-core")


def test_published_deepseek_v3_layout_is_a_candidate() -> None:
    """DeepSeek-V3 on 2,048 H800: pp16 DualPipe, ep64, ZeRO-1, no TP, on DeepSeek's stack."""
    space = load_space("deepseek-v3-2k")
    cand = make_candidate(space, HardwareCatalog(space), space.complete(
        {"tp": 1, "pp": 16, "ep": 64, "mbs": 1, "recompute": "none", "schedule": "dualpipe", "last_layers": 1}))
    assert (cand.plan.schedule, cand.plan.dp, cand.plan.ep, cand.plan.framework.name) == ("dualpipe", 128, 64,
                                                                                          "hai-llm")
    assert cand.hw_key == "h100-sxm node.bandwidth_gbps=200"  # H800: NVLink 400 GB/s bidirectional


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(framework="megatron-cor"), ["framework", "megatron-core"]),
    (lambda d: d["plan"].update(first_layers=[-1]), ["plan.first_layers", "-1"]),
    (lambda d: d["plan"].update(embed_split=["maybe"]), ["plan.embed_split", "on/off"]),
    (lambda d: d["plan"].update(pp=1, loss_split=["on", "off"]), ["plan.loss_split", "every pp is 1"]),
    (lambda d: d["plan"].update(cp_comm=["p2p", "a2a"]), ["plan.cp_comm", "every cp is 1"]),
    (lambda d: d["plan"].update(cp_comm=["ring"]), ["plan.cp_comm", "all_gather, p2p, a2a"]),
    (lambda d: d["plan"].update(moe_overlap=["on", "off"]), ["plan.moe_overlap", "no shared experts"]),
])
def test_bad_new_keys_are_one_line_errors(mutate, words) -> None:
    data = {"model": "llama3-8b", "cluster": {"gpus": 8}, "training": {"global_batch": 8},
            "plan": {"pp": [1, 2]}}
    mutate(data)
    with pytest.raises(ConfigError) as err:
        space_from_dict(data)
    for word in words:
        assert word in str(err.value)
