"""What Optuna's own tools read from a finished study: optuna-dashboard's API and Optuna's storage calls.

The best trial any tool names must be a plan that fits in memory, parameters and
objectives carry their real names, results are flat sortable attributes, and a
plan proposed twice is not a second COMPLETE trial.
"""

from __future__ import annotations

import json
import wsgiref.util
from pathlib import Path

import optuna
import pytest
from conftest import SMALL, search_json
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState


def _optuna_storage(runs: Path, name: str) -> JournalStorage:
    """The journal as optuna-dashboard opens a .log path: Optuna's own backend, nothing of ours."""
    return JournalStorage(JournalFileBackend(str(runs / name / "journal.log")))


def _get(app, path: str) -> dict:
    environ: dict = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, REQUEST_METHOD="GET", QUERY_STRING="")
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status and status[0].startswith("200"), (status, body[:300])
    return json.loads(body)


@pytest.fixture(scope="module", params=["tpe", "auto"])
def single(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The small space on 40 GiB GPUs: its fastest plan (tp=1 pp=1 mbs=2) needs far more than 40 GiB. It is
    seeded so that the study surely holds it: sampled by TPE, or recorded beside the exact census's answer."""
    tmp = tmp_path_factory.mktemp("dash")
    space = tmp / "small-40g.yaml"
    space.write_text(SMALL.read_text().replace("hardware: h100-sxm", "hardware: h100-sxm\n  hw_set: [gpu.hbm_gib=40]"))
    search_json("--space", str(space), "--sampler", request.param, "--budget", "40", "--seed", "2", "--runs-dir",
                str(tmp / "runs"), "--study-name", "one", "--seed-plan", "tp=1 pp=1 mbs=2 zero=1 recompute=none sp=on")
    return tmp / "runs"


def test_storage_best_trial_fits_in_memory_even_when_a_faster_plan_does_not(single: Path) -> None:
    storage = _optuna_storage(single, "one")
    study_id = storage.get_study_id_from_name("one")
    best = storage.get_best_trial(study_id)  # what optuna-dashboard calls: constraints are not consulted
    assert best.user_attrs["status"] == "ok" and best.user_attrs["memory_gib"] <= best.user_attrs["hbm_gib"]
    oom = [t for t in storage.get_all_trials(study_id) if t.user_attrs.get("status") == "oom"]
    assert oom and all(t.state == TrialState.PRUNED and t.constraints["memory_gib"] > 0 for t in oom)
    assert min(t.user_attrs["iteration_time_s"] for t in oom) < best.value  # the trap a COMPLETE encoding falls in
    study = optuna.load_study(study_name="one", storage=storage)
    assert study.best_trial.number == best.number
    assert set(study.best_params) == {"tp", "pp", "mbs", "zero", "recompute"}


def test_no_plan_is_complete_twice(single: Path) -> None:
    study = optuna.load_study(study_name="one", storage=_optuna_storage(single, "one"))
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    keys = [t.user_attrs["key"] for t in complete]
    assert len(keys) == len(set(keys))
    repeats = [t for t in study.trials if t.user_attrs.get("status") == "repeat"]
    for t in repeats:
        assert t.state == TrialState.PRUNED and study.trials[t.user_attrs["repeat_of"]].user_attrs["key"] == \
            t.user_attrs["key"]


def test_optuna_dashboard_shows_names_attributes_and_the_right_best(single: Path) -> None:
    dashboard = pytest.importorskip("optuna_dashboard")
    app = dashboard.wsgi(_optuna_storage(single, "one"))
    studies = _get(app, "/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == "one")
    detail = _get(app, f"/api/studies/{study_id}")
    assert detail["objective_names"] == ["iteration time (s)"]
    (best,) = detail["best_trials"]
    attrs = {a["key"]: a["value"] for a in best["user_attrs"]}
    assert attrs["status"] == "ok" and float(attrs["memory_gib"]) <= float(attrs["hbm_gib"])
    assert {p["name"] for p in best["params"]} == {"tp", "pp", "mbs", "zero", "recompute"}
    assert {p["param_external_value"] for p in best["params"] if p["name"] == "tp"} <= {"1", "2", "4", "8"}
    sortable = {a["key"] for a in detail["union_user_attrs"] if a["sortable"]}
    assert {"memory_gib", "iteration_time_s", "mfu", "tokens_per_s", "time_compute_s", "mem_activations_gib"} <= sortable
    assert all(len(a["value"]) < 200 for a in best["user_attrs"])  # flat: nothing for the dashboard to cut


def test_two_objectives_dashboard_front_is_feasible_and_distinct(tmp_path: Path) -> None:
    dashboard = pytest.importorskip("optuna_dashboard")
    runs = tmp_path / "runs"
    search_json("--space", str(SMALL), "--objectives", "time,cost", "--budget", "30", "--seed", "4",
                "--runs-dir", str(runs), "--study-name", "two")
    app = dashboard.wsgi(_optuna_storage(runs, "two"))
    detail = _get(app, "/api/studies/0")
    assert detail["objective_names"] == ["iteration time (s)", "USD per 1M tokens"]
    front = detail["best_trials"]
    plans = [{a["key"]: a["value"] for a in t["user_attrs"]}["key"] for t in front]
    assert front and len(plans) == len(set(plans))
    assert all({a["key"]: a["value"] for a in t["user_attrs"]}["status"] == "ok" for t in front)
