"""Many ``stageopt search`` processes on one study, over the journal file and over a real PostgreSQL server:
they never crash each other, never simulate a plan twice, and a worker killed with SIGKILL has its running
trials failed (and its plans retried) while the live worker's trials are left alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import sqlalchemy
import pytest
from conftest import HERE, REPO, SMALL
from optuna.trial import TrialState
from pg_server import throwaway_postgres

from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.session import SearchOptions, run_search
from stageopt.search.space import load_space
from stageopt.search.storage import postgres_url


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with throwaway_postgres() as url:
        yield url


def _worker(runs: Path, storage: str | None, name: str, *args: str) -> subprocess.Popen:
    where = ["--storage", storage] if storage else []
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    space = [] if "--space" in args else ["--space", str(SMALL)]
    return subprocess.Popen([sys.executable, "-m", "stageopt.cli", "search", "--json", "--no-plots", "--sampler", "tpe", *space,
                             "--runs-dir", str(runs), "--study-name", name, *where, *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out)


def _study(runs: Path, storage: str | None, name: str) -> optuna.Study:
    """Opened with Optuna's own storage classes, as any Optuna tool would."""
    if storage is None:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return optuna.load_study(study_name=name,
                                 storage=JournalStorage(JournalFileBackend(str(runs / name / "journal.log"))))
    return optuna.load_study(study_name=name, storage=postgres_url(storage))


def _simulated(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
            if t.user_attrs.get("simulated")]


def _owner_pid(t: optuna.trial.FrozenTrial) -> str:
    return t.system_attrs["stageopt:owner"].split()[-3]


def _wait_for_trials(runs: Path, storage: str | None, name: str, n: int, proc: subprocess.Popen) -> None:
    """Until ``proc`` has asked ``n`` trials of the study (or ended)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # not created yet; or, on a fresh PostgreSQL database, this unlocked Optuna reader racing the
        # workers' (locked) creation of Optuna's tables
        with contextlib.suppress(KeyError, FileNotFoundError, sqlalchemy.exc.SQLAlchemyError):
            owned = [t for t in _study(runs, storage, name).trials if "stageopt:owner" in t.system_attrs]
            if sum(_owner_pid(t) == str(proc.pid) for t in owned) >= n:
                return
        time.sleep(0.2)


def test_two_workers_on_one_journal_never_simulate_a_plan_twice(tmp_path: Path) -> None:
    """A CLI worker on the default space (3,501 plans); once it is searching, a second worker joins from this
    process (no start-up delay). The budget is large enough that the first is still searching when the second has
    joined, even on two loaded cores: at 300 the first once finished before the second asked a trial."""
    runs, name, budget = tmp_path / "runs", "two", 600
    space = load_space("default")
    take_census(space, HardwareCatalog(space))  # compile the cost model here first, so the join is quick
    first = _worker(runs, None, name, "--space", "default", "--join", "--budget", str(budget))
    _wait_for_trials(runs, None, name, 1, first)
    assert first.poll() is None, "the first worker finished before the second could join"
    second = run_search(SearchOptions(budget=budget, runs_dir=str(runs), study_name=name, join=True))
    _finish(first)
    study = _study(runs, None, name)
    keys = [t.user_attrs["key"] for t in _simulated(study)]
    assert len(keys) == len(set(keys)) == budget  # the budget is the study's; no plan simulated twice
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert {_owner_pid(t) for t in _simulated(study)} == {str(first.pid), str(os.getpid())}  # both simulated
    assert second.stats.cached + second.stats.told > 0


def test_postgresql_two_workers_kill_9_of_one_resume_and_report(postgres: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain postgresql:// URL; two workers join one study; one is killed; the other finishes undisturbed;
    --resume completes the budget; report rebuilds best.json whole. No plan is simulated twice."""
    runs, name, budget = tmp_path / "runs", "pg", 24
    # Both workers simulate through the slow stand-in (the analytical answer after 0.5 s), so the victim is
    # surely still searching once it owns 4 trials, however fast this machine runs the analytical model.
    monkeypatch.setenv("STAGEOPT_TEST_SLEEP_S", "0.5")
    slow = ("--backend", "search_doubles:SleepSimulator")
    victim = _worker(runs, postgres, name, "--join", "--budget", str(budget), *slow)
    survivor = _worker(runs, postgres, name, "--join", "--budget", str(budget), *slow)
    _wait_for_trials(runs, postgres, name, 4, victim)
    assert victim.poll() is None, "the first worker finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    _finish(survivor)  # the live worker is not disturbed by the death
    study = _study(runs, postgres, name)
    owned = [t for t in study.trials if "stageopt:owner" in t.system_attrs]
    assert {_owner_pid(t) for t in owned} == {str(victim.pid), str(survivor.pid)}
    # a trial the victim created but was killed before claiming carries no owner; --resume below must
    # leave no trial RUNNING, that one included
    # (a trial the survivor asked once the budget was claimed is FAIL too, with its reason: not stale)
    stale = [t for t in study.get_trials(states=(TrialState.FAIL,))
             if not t.user_attrs.get("status") and not t.user_attrs.get("reason")
             and "stageopt:owner" in t.system_attrs]
    assert all(_owner_pid(t) == str(victim.pid) for t in stale)  # only the dead worker's trials were failed
    out = _finish(_worker(runs, postgres, name, "--resume", "--budget", str(budget)))
    study = _study(runs, postgres, name)
    keys = [t.user_attrs["key"] for t in _simulated(study)]
    assert out["simulations"] == budget and len(keys) == len(set(keys)) == budget
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert study.best_trial.user_attrs["status"] == "ok"
    proc = subprocess.run([sys.executable, "-m", "stageopt.cli", "report", str(runs / name), "--storage", postgres,
                           "--study-name", name, "--no-plots", "--json"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)
    assert best["best"][0]["plan"] == out["best"][0]["plan"]
    assert best["stop_reason"] == out["stop_reason"] and best["simulations"] == budget


def test_workers_joining_an_exact_study_record_the_census_answer_once(tmp_path: Path) -> None:
    """The census's answer is recorded once, however many workers join: the second finds it held."""
    opts = SearchOptions(space=str(SMALL), sampler="auto", runs_dir=str(tmp_path), study_name="exact", join=True,
                         top=5)
    first, second = run_search(opts), run_search(opts)
    study = _study(tmp_path, None, "exact")
    keys = [t.user_attrs["key"] for t in study.get_trials(states=(TrialState.COMPLETE,))]
    assert len(keys) == len(set(keys)) == 5 == len(study.trials)
    assert (first.stats.told, second.stats.told) == (5, 0)
    assert study.best_trial.user_attrs["key"] == first.answer.best[0].key == second.answer.best[0].key
