"""The serving search on a small space: exact enumeration, the screen, the Pareto front, the dispatch."""

from __future__ import annotations

import json

import pytest
import yaml

from stageopt.cli import main
from stageopt.errors import ConfigError
from stageopt.serving.serve_plan import ServePlan
from stageopt.serving.serving_search import enumerate_plans, pareto_front, score_all, user_rate
from stageopt.serving.serving_space import load_serving_space

SPACE = {"kind": "serving", "name": "tiny", "model": "llama3-8b",
         "traffic": {"rate": 3, "input": 512, "output": 64, "requests": 120},
         "slo": {"ttft_ms": 500, "tpot_ms": 30, "percentile": 90},
         "cluster": {"hardware": ["h100-sxm"], "gpus": [2, 4]},
         "plan": {"mode": ["colocated", "disaggregated"], "tp": [1, 2], "max_seqs": [32, 128],
                  "max_tokens": [2048]},
         "simulate": 3}


def _write(tmp_path, data):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_enumeration_is_exact(tmp_path):
    space = load_serving_space(_write(tmp_path, SPACE))
    plans = [p.describe() for p in enumerate_plans(space)]
    assert len(plans) == len(set(plans))
    colocated = [p for p in plans if "prefill" not in p]
    # per GPU count: tp=1 and tp=2 instances filling it exactly, times two max_seqs
    assert len(colocated) == 2 * (2 + 2)
    disagg = [ServePlan.parse(p) for p in plans if "prefill" in p]
    assert all(p.gpus in (2, 4) for p in disagg)
    four = {p.describe() for p in disagg if p.gpus == 4}
    # 4 GPUs: tp1 prefill x1..x3 with tp1 decode, tp1 x2 | tp2 x1, tp2 x1 | tp1 x2, tp2 | tp2; each with 2 max_seqs
    assert len(four) == 2 * (3 + 1 + 1 + 1)
    assert ServePlan.parse("prefill: tp=2 x=1 max_tokens=2048 | decode: tp=2 x=1 max_seqs=32 max_tokens=2048").describe() in four
    assert len([p for p in disagg if p.gpus == 2]) == 2  # decode max_seqs 32 or 128


def test_pareto_front_is_not_dominated(tmp_path):
    scored = score_all(load_serving_space(_write(tmp_path, SPACE)))
    front = pareto_front(scored)
    assert front
    for f in front:
        for s in scored:
            if s.fits:
                assert not (s.capacity_per_gpu > f.capacity_per_gpu * (1 + 1e-9)
                            and user_rate(s) > user_rate(f) * (1 + 1e-9))


def test_search_dispatches_serving_spaces(tmp_path, capsys):
    path = _write(tmp_path, SPACE)
    rc = main(["search", "--space", str(path), "--runs-dir", str(tmp_path / "runs"), "--study-name", "t",
               "--no-plots", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["kind"] == "serving" and out["simulated"] <= 3
    assert out["best"] is None or out["best"]["meets_slo"] is True
    assert (tmp_path / "runs" / "t" / "candidates.csv").exists()


@pytest.mark.parametrize("change, fragment", [
    ({"plan": {"tpp": [1]}}, "did you mean 'tp'"), ({"plan": {"mode": ["split"]}}, "plan.mode"),
    ({"slo": {"ttft_ms": -1}}, "ttft_ms=-1.0 must be positive"), ({"simulate": -2}, "simulate must be")])
def test_bad_serving_space_names_the_key(tmp_path, change, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_serving_space(_write(tmp_path, {**SPACE, **change}))


def test_shipped_serving_spaces_load():
    from stageopt.search.space import list_spaces, resolve_space_path
    from stageopt.serving.serving_space import is_serving_space

    shipped = [resolve_space_path(n) for n in list_spaces() if is_serving_space(resolve_space_path(n))]
    assert any(p.stem == "serve-llama3-70b" for p in shipped)
    for path in shipped:
        space = load_serving_space(path)
        assert space.size_hint() > 0 and space.slo.tpot_ms
