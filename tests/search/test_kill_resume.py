"""A search killed with SIGKILL at a random moment, then resumed, loses no finished trial, simulates no plan
twice and reaches its budget; the dead worker's running trials are failed by the stale-trial check."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
from conftest import HERE, REPO, run_cli
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend


def _load(journal: Path, name: str) -> optuna.Study:
    """With Optuna's own journal backend: what optuna-dashboard and any Optuna script read."""
    return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(journal))))


def _finished(journal: Path, name: str) -> dict[int, tuple]:
    study = _load(journal, name)
    return {t.number: (t.state.name, tuple(t.values or ())) for t in study.get_trials()
            if t.state.is_finished()}


def _some_finished(journal: Path, name: str) -> bool:
    """Whether the journal, read while the search writes it, already holds a finished trial."""
    try:
        return bool(_finished(journal, name))
    except Exception:  # noqa: BLE001 - a half-written record or a study not created yet: not yet
        return False


def test_kill_9_then_resume_loses_nothing(tmp_path: Path) -> None:
    runs, name, budget = tmp_path / "runs", "k", 150
    journal = runs / name / "journal.log"
    args = ["search", "--sampler", "tpe", "--budget", str(budget), "--seed", "5", "--runs-dir", str(runs),
            "--study-name", name,
            "--no-plots", "--json"]
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    proc = subprocess.Popen([sys.executable, "-m", "stageopt.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    threshold = random.Random().randint(20_000, 200_000)  # bytes of journal: a random point mid-search
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and journal.stat().st_size > threshold and _some_finished(journal, name):
            break  # past the random point, and at least one trial told (a batch's asks alone can pass it)
        time.sleep(0.01)
    assert proc.poll() is None, "search finished before it could be killed; raise the budget"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _finished(journal, name)
    assert before, "nothing was told before the kill"

    done = run_cli(*[a for a in args if a != "--json"][:1], *args[1:], "--resume", timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["simulations"] == budget
    after = _finished(journal, name)
    for number, state_values in before.items():
        assert after[number] == state_values  # every trial finished before the kill is kept as it was
    study = _load(journal, name)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    simulated = [t.user_attrs["key"] for t in study.trials if t.user_attrs.get("simulated") and t.state.name != "FAIL"]
    assert len(simulated) == len(set(simulated)) == budget  # each plan simulated once, across the kill
    assert study.best_trial.user_attrs["status"] == "ok"
