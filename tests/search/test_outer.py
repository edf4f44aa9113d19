"""Co-design as an outer loop: Optuna proposes hardware (here a continuous scale-out bandwidth), and each
candidate is told the exact best plan on that machine (checked against an independent brute force)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from conftest import SMALL, brute_force_small, search_json
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend


def test_each_hardware_candidate_gets_its_exact_best_plan(tmp_path: Path) -> None:
    data = yaml.safe_load(SMALL.read_text())
    data["codesign"] = {"scaleout_gbps": {"low": 5, "high": 400, "log": True}}
    space = tmp_path / "bw.yaml"
    space.write_text(yaml.safe_dump(data))
    runs = tmp_path / "runs"
    out = search_json("--space", str(space), "--budget", "5", "--seed", "2", "--runs-dir", str(runs),
                      "--study-name", "o")
    assert out["mode"] == "outer" and out["lines"][0].startswith("co-design: 5 hardware candidates")
    study = optuna.load_study(study_name="o", storage=JournalStorage(JournalFileBackend(str(runs / "o" / "journal.log"))))
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len({t.params["scaleout_gbps"] for t in done}) == 5
    for t in done:
        bw = t.params["scaleout_gbps"]
        _, best_time, best_plan = brute_force_small((f"scaleout.bandwidth_gbps={bw:g}",))
        assert t.value == pytest.approx(best_time, rel=1e-9)
        assert t.user_attrs["plan"] == best_plan and t.user_attrs["status"] == "ok"
    assert out["best"][0]["iteration_time_s"] == pytest.approx(min(t.value for t in done), rel=1e-12)
