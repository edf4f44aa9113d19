"""Ray executor: tasks run on workers, a crash/raise becomes a FAIL trial with its reason, the study goes on."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import HERE, SMALL, search_json


@pytest.fixture(scope="module", autouse=True)
def _ray_available():
    pytest.importorskip("ray")


def _run(runs: Path, backend: str, *extra: str) -> dict:
    try:
        return search_json("--space", str(SMALL), "--backend", backend, "--runs-dir", str(runs),
                           "--study-name", "ray", *extra, timeout=240,
                           env={"STAGEOPT_TEST_SLEEP_S": "0.05", "PYTHONPATH": str(HERE)})
    except AssertionError as err:
        if "Ray failed to start" in str(err):
            pytest.skip(f"Ray cannot start here: {err}")
        raise


def test_crashes_and_errors_become_fail_trials(tmp_path: Path) -> None:
    out = _run(tmp_path / "runs", "search_doubles:FlakySimulator", "--budget", "12", "--workers", "2", "--seed", "1",
               "--seed-plan", "tp=1 pp=1 mbs=1 zero=1 recompute=full sp=on", "--seed-plan", "tp=2 pp=1 mbs=1 zero=1 recompute=full sp=on")
    rows = list(csv.DictReader((tmp_path / "runs" / "ray" / "trials.csv").open()))
    failed = {r["tp"]: r["reason"] for r in rows if r["state"] == "FAIL"}
    assert "worker crashed" in failed["1"]
    assert "refuses tp=2" in failed["2"]
    assert out["failed"] >= 2 and out["simulations"] == 12
    assert out["best"] and all(b["plan"].startswith(("tp=4", "tp=8")) for b in out["best"])


def test_timeouts_fail_and_the_study_continues(tmp_path: Path) -> None:
    out = _run(tmp_path / "runs", "search_doubles:HangSimulator", "--budget", "4", "--workers", "2", "--timeout", "2",
               "--seed-plan", "tp=8 pp=1 mbs=1 zero=1 recompute=full sp=on")
    rows = list(csv.DictReader((tmp_path / "runs" / "ray" / "trials.csv").open()))
    assert any("timeout" in r["reason"] for r in rows if r["state"] == "FAIL")
    assert out["simulations"] == 4
