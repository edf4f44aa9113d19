"""Which running trials are stale: a live worker's never, a dead worker's at once on this machine, and a
worker elsewhere only after its heartbeat is older than the grace period."""

from __future__ import annotations

import datetime
import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState

from stageopt.search import workers
from stageopt.search.workers import GRACE_S, HeartbeatKeeper, machine_id, owner_alive, stale_trial_ids


def _running(number: int, owner: str | None, started_s_ago: float = 0.0) -> optuna.trial.FrozenTrial:
    start = datetime.datetime.now() - datetime.timedelta(seconds=started_s_ago)
    trial = optuna.trial.create_trial(state=TrialState.RUNNING, system_attrs={"stageopt:owner": owner} if owner
                                      else {})
    trial._trial_id, trial.number, trial.datetime_start = number, number, start
    return trial


def _owner(pid: int, start: str = "-", session: str = "s", machine: str | None = None) -> str:
    return f"{machine or machine_id()} {pid} {start} {session}"


def test_dead_worker_on_this_machine_is_stale_at_once_and_a_live_one_never() -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        trials = [_running(0, _owner(live.pid), started_s_ago=10 * GRACE_S),  # old, but its process runs
                  _running(1, _owner(dead.pid))]  # new, but its process is gone
        assert stale_trial_ids(trials, lambda t: None, GRACE_S) == [1]
        assert owner_alive(_owner(live.pid)) is True and owner_alive(_owner(dead.pid)) is False
    finally:
        live.kill()
        live.wait()


def test_reused_pid_with_another_start_time_is_dead() -> None:
    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = workers._start_time(me.pid)
        assert owner_alive(_owner(me.pid, real)) is True
        assert owner_alive(_owner(me.pid, str(int(real) - 1))) is False
    finally:
        me.kill()
        me.wait()


def test_worker_elsewhere_is_judged_by_its_heartbeat() -> None:
    elsewhere = _owner(123, machine="other-host|boot|ns")
    beats = {0: time.time() - 5, 1: time.time() - 2 * GRACE_S}
    trials = [_running(0, elsewhere, 10 * GRACE_S), _running(1, elsewhere), _running(2, None, 2 * GRACE_S),
              _running(3, None, 1)]
    assert stale_trial_ids(trials, lambda t: beats.get(t.number), GRACE_S) == [1, 2]
    assert owner_alive(elsewhere) is None


def test_a_search_that_ended_in_this_process_is_dead(tmp_path) -> None:
    storage = optuna.storages.InMemoryStorage()
    with HeartbeatKeeper(storage, 10) as keeper:
        assert owner_alive(keeper.owner) is True
    assert owner_alive(keeper.owner) is False  # e.g. it stopped on a full disk; the next search may retry


def test_an_asked_trial_is_owned_from_its_creation_and_enqueued_plans_come_first() -> None:
    """The storage never holds an asked trial without its owner (a SIGKILL between two writes left one)."""
    study = optuna.create_study()
    study.enqueue_trial({"x": 1})
    owner = _owner(12345)
    created: list[optuna.trial.FrozenTrial] = []
    real_create = study._storage.create_new_trial

    def spy(study_id: int, template_trial: optuna.trial.FrozenTrial | None = None) -> int:
        trial_id = real_create(study_id, template_trial=template_trial)
        created.append(study._storage.get_trial(trial_id))  # as the storage holds it before any other write
        return trial_id

    study._storage.create_new_trial = spy  # type: ignore[method-assign]
    first, second = workers.ask_owned(study, owner), workers.ask_owned(study, owner)
    assert first.suggest_int("x", 0, 3) == 1 and first.number == 0  # the enqueued plan, popped as ask pops it
    assert [t.system_attrs["stageopt:owner"] for t in created] == [owner] and second.number == 1
    assert all(study._storage.get_trial(t._trial_id).system_attrs["stageopt:owner"] == owner
               for t in (first, second))
