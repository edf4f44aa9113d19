"""``stageopt serve`` end to end: JSON keys, bad input exits 2, step traces that validate and replay."""

from __future__ import annotations

import json

from stageopt.chakra import validate_trace_dir
from stageopt.cli import main


def test_serve_json_and_traces(tmp_path, capsys):
    rc = main(["serve", "--model", "llama3-8b", "--plan", "tp=2 pp=2 max_seqs=32 max_tokens=2048",
               "--traffic", "rate=2 input=512 output=32 requests=30", "--slo", "ttft_ms=1000 tpot_ms=100",
               "--traces", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["gpus"] == 4 and out["slo"]["met"] is True
    assert set(out["simulated"]) >= {"ttft_ms", "tpot_ms", "e2e_ms", "requests"}
    for step in ("prefill", "decode"):
        report = validate_trace_dir(tmp_path / step)
        assert report.ok, report
    rc = main(["replay", "--workload", str(tmp_path / "decode" / "workload"),
               "--comm-group", str(tmp_path / "decode" / "comm_groups.json"),
               "--system", str(tmp_path / "decode" / "system.json"),
               "--network", str(tmp_path / "decode" / "network.yml")])
    assert rc == 0 and "sys[3] finished" in capsys.readouterr().out


def test_serve_bad_input_is_one_line(capsys):
    assert main(["serve", "--model", "llama3-8b", "--plan", "tp=2", "--traffic", "rate=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rate=0.0 must be positive" in err[0]
