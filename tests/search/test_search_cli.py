"""`stageopt search` end to end on a small space: the optimum equals an independent brute force,
repeats cost nothing, resume keeps counts, report rebuilds the files, bad inputs exit 2 in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pytest
from conftest import SMALL, brute_force_small, run_cli, search_json
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from stageopt.hardware import load_hardware


def test_analytical_search_returns_the_exact_optimum_and_records_it(runs: Path) -> None:
    n_feasible, best_time, best_plan = brute_force_small()
    out = search_json("--space", str(SMALL), "--budget", "5", "--runs-dir", str(runs), "--study-name", "s")
    assert out["mode"] == "exact" and out["lines"][0].startswith("exact: ")
    assert out["feasible_plans_in_space"] == n_feasible
    assert out["best"][0]["iteration_time_s"] == pytest.approx(best_time, rel=1e-9)
    assert out["best"][0]["plan"] == best_plan
    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(runs / "s" / "journal.log"))))
    assert study.best_trial.user_attrs["plan"] == best_plan  # what optuna-dashboard shows
    fields = dict(item.split("=") for item in best_plan.split())
    assert study.best_trial.params == {k: v if k == "recompute" else int(v) for k, v in fields.items()
                                       if k in ("tp", "pp", "mbs", "zero", "recompute")}  # real names and values
    assert study.best_trial.constraints["memory_gib"] <= 0
    assert len(study.trials) == 10  # the exact top 10, not a sample
    rows = list(csv.DictReader((runs / "s" / "trials.csv").open()))
    assert len(rows) == out["trials"]
    assert len({r["plan"] for r in rows}) == 10 and all(r["status"] == "ok" for r in rows)  # 10 distinct plans
    assert out["simulations"] >= n_feasible  # every valid plan was scored by the census
    best = json.loads((runs / "s" / "best.json").read_text())
    assert best["best"][0]["plan"] == best_plan
    preset = load_hardware(out["best"][0]["hardware"]).accuracy  # the best plan's preset states its validation
    assert f"+/-{preset.held_out_mape:.1f}% per plan" in out["accuracy"]
    assert f"at most {preset.top1_regret:.1f}% slower" in out["accuracy"]


def test_sampled_search_counts_unique_simulations_resumes_and_reports_the_gap(runs: Path) -> None:
    first = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "20", "--seed", "1", "--runs-dir",
                        str(runs), "--study-name", "r")
    assert first["simulations"] == 20 and first["mode"] == "sample"
    _, best_time, _ = brute_force_small()
    if first["best"][0]["iteration_time_s"] > best_time * (1 + 1e-9):  # a sample that missed is told so
        assert "census's exact optimum is" in first["lines"][0]
    again = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "35", "--seed", "1", "--runs-dir",
                        str(runs), "--study-name", "r", "--resume")
    assert again["simulations"] == 35 and again["trials"] >= first["trials"] + 15


def test_seed_makes_runs_reproducible(runs: Path) -> None:
    a = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "25", "--seed", "7", "--runs-dir", str(runs),
                    "--study-name", "a")
    b = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "25", "--seed", "7", "--runs-dir", str(runs),
                    "--study-name", "b")
    ta = [r["plan"] for r in csv.DictReader((runs / "a" / "trials.csv").open())]
    tb = [r["plan"] for r in csv.DictReader((runs / "b" / "trials.csv").open())]
    assert ta == tb and a["best"] == b["best"]


def test_seed_plan_is_evaluated_first_and_report_rebuilds(runs: Path) -> None:
    search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "5", "--seed", "1", "--runs-dir", str(runs),
                "--study-name", "p",
                "--seed-plan", "tp=8 pp=2 mbs=1 zero=1 recompute=full sp=on")
    rows = list(csv.DictReader((runs / "p" / "trials.csv").open()))
    assert (rows[0]["tp"], rows[0]["pp"], rows[0]["recompute"]) == ("8", "2", "full")
    written = json.loads((runs / "p" / "best.json").read_text())
    (runs / "p" / "best.json").unlink()
    proc = run_cli("report", str(runs / "p"), "--no-plots")
    assert proc.returncode == 0, proc.stderr
    assert (runs / "p" / "best.json").is_file() and "time s" in proc.stdout
    rebuilt = json.loads((runs / "p" / "best.json").read_text())
    assert rebuilt == written  # whole: run_dir, space, simulations, stop_reason, ... and the best plan


@pytest.mark.parametrize("args, words", [
    (["--space", "nonexistent.yaml"], ["nonexistent.yaml", "not found"]),
    (["--space", "defualt"], ["did you mean 'default'"]),
    (["--storage", "notaurl"], ["--storage", "not a URL"]),
    (["--storage", "postgresql://nobody@127.0.0.1:1/db"], ["--storage", "postgresql://"]),
    (["--storage", "sqlite:////nonexistent-dir/x.db"], ["--storage", "cannot open"]),
    (["--backend", "replay", "--ray-address", "127.0.0.1:1"], ["--ray-address", "cannot reach"]),
    (["--objectives", "time,speed"], ["objective 'speed'"]),
    (["--budget", "0"], ["--budget"]),
    (["--reserve-gib", "-1"], ["--reserve-gib"]),
    (["--batch", "0"], ["--batch 0", "at least 1"]),
    (["--max-asks", "0"], ["--max-asks 0", "at least 1"]),
    (["--timeout", "-1"], ["--timeout -1", "positive"]),
    (["--timeout", "nan"], ["--timeout nan", "positive"]),
    (["--timeout", "inf"], ["--timeout inf", "positive"]),
    (["--resume", "--join", "--study-name", "x"], ["--resume and --join"]),
    (["--resume", "--study-name", "nothing-here"], ["--resume", "no study"]),
])
def test_bad_inputs_exit_2_with_one_line(runs: Path, args: list[str], words: list[str]) -> None:
    proc = run_cli("search", "--space", str(SMALL), "--runs-dir", str(runs), *args)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("stageopt: error:"), err
    for w in words:
        assert w in err


def test_a_budget_beyond_the_space_stops_when_every_plan_is_simulated(runs: Path) -> None:
    n_feasible, _, _ = brute_force_small()
    out = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "1000000000000", "--seed", "1",
                      "--runs-dir", str(runs), "--study-name", "huge", timeout=300)
    assert out["stop_reason"] == "every candidate simulated" and n_feasible <= out["simulations"] < 100


def test_space_with_no_feasible_plan_says_why(tmp_path: Path, runs: Path) -> None:
    space = tmp_path / "tight.yaml"
    space.write_text(SMALL.read_text().replace("hardware: h100-sxm", "hardware: h100-sxm\n  hw_set: [gpu.hbm_gib=1]"))
    proc = run_cli("search", "--space", str(space), "--runs-dir", str(runs))
    assert proc.returncode == 2
    assert "no plan fits 1 GiB with a 2.0 GiB reserve: smallest needs" in proc.stderr and " GiB at tp=" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_gp_sampler_works_with_torch_or_is_refused_up_front(runs: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        proc = run_cli("search", "--space", str(SMALL), "--runs-dir", str(runs), "--sampler", "gp")
        assert proc.returncode == 2
        assert proc.stderr.strip() == ("stageopt: error: --sampler gp needs PyTorch: pip install 'stageopt[gp]' "
                                       "(or use --sampler tpe)")
        assert not runs.exists()  # nothing written: no half-made study
        return
    out = search_json("--space", str(SMALL), "--sampler", "gp", "--budget", "12", "--seed", "1", "--runs-dir",
                      str(runs), "--study-name", "gp", timeout=300)
    assert out["simulations"] == 12 and out["best"][0]["iteration_time_s"] > 0
