"""`stageopt inspect --json`: the keys scripts rely on, and totals consistent with the stages."""

import json

import pytest

from stageopt.cli import main


def inspect_json(capsys, model, plan, gpus):
    assert main(["inspect", "--model", model, "--plan", plan, "--gpus", str(gpus), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_top_level_and_stage_keys(capsys):
    rep = inspect_json(capsys, "llama3-70b", "tp=8 pp=4 mbs=1 gbs=64 zero=1 sp=on", 256)
    for key in ("params_total", "params_active", "flops_per_iteration", "tokens_per_iteration", "stages"):
        assert key in rep
    assert rep["tokens_per_iteration"] == 64 * 8192
    assert len(rep["stages"]) == 4
    for st in rep["stages"]:
        assert set(st["memory_gib"]) == {"weights", "gradients", "optimizer", "activations", "other", "total"}
        assert st["memory_gib"]["total"] == pytest.approx(sum(v for k, v in st["memory_gib"].items() if k != "total"))
        assert {"fwd", "bwd", "recompute", "optimizer", "total"} <= set(st["flops"])
        assert all({"group", "type", "bytes_each", "count"} <= set(c) for c in st["collectives"])
    ranks_per_stage = 256 // 4
    assert rep["flops_per_iteration"] == pytest.approx(sum(s["flops"]["total"] for s in rep["stages"]) * ranks_per_stage)


def test_forward_backward_ratio_is_two(capsys):
    """Every matmul's backward is two matmuls of the same size: bwd FLOPs = 2 x fwd FLOPs."""
    rep = inspect_json(capsys, "gpt3-175b", "tp=8 pp=8 mbs=1 gbs=64", 512)
    for st in rep["stages"]:
        assert st["flops"]["bwd"] == pytest.approx(2 * st["flops"]["fwd"])
