"""Many workers, one study: who owns a running trial, whether it is still alive, and its heartbeat.

Why: any number of ``stageopt search`` processes may work on one study (the
journal file or a database). A trial left RUNNING by a worker that died must be
failed so that its plan can be simulated again, but a live worker's trials must
never be. Two signals decide, both through Optuna's heartbeat interface
(``BaseHeartbeat``; ``optuna.storages.fail_stale_trials`` does the failing):

* the owner: each asked trial records ``host|boot|pid-namespace pid start-time``;
  a worker on the same machine knows at once whether that process still runs;
* the heartbeat: every owner refreshes its running trials every
  ``HEARTBEAT_INTERVAL_S``; a trial whose owner runs elsewhere is stale only when
  its heartbeat is older than ``GRACE_S``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from functools import lru_cache

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

OWNER_ATTR = "stageopt:owner"
HEARTBEAT_ATTR = "stageopt:heartbeat"
HEARTBEAT_INTERVAL_S = 10
GRACE_S = 60
STALE_CHECK_EVERY_S = 2.0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def machine_id() -> str:
    """This machine and PID namespace: PIDs are comparable only between processes that share it."""
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    return f"{socket.gethostname()}|{_read('/proc/sys/kernel/random/boot_id')}|{pid_ns}"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc is absent): tells a reused PID apart."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[-1].split()[19] if stat else ""


_ACTIVE_SESSIONS: set[str] = set()  # searches running in this process (a process may run one after another)


def this_owner(session: str) -> str:
    pid = os.getpid()
    return f"{machine_id()} {pid} {_start_time(pid) or '-'} {session}"


def owner_alive(owner: str) -> bool | None:
    """True or False for an owner on this machine; None when it runs elsewhere (only its heartbeat can tell)."""
    head, _, session = owner.rpartition(" ")
    head, _, start = head.rpartition(" ")
    machine, _, pid_text = head.rpartition(" ")
    if machine != machine_id() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if pid == os.getpid():
        return session in _ACTIVE_SESSIONS  # an earlier search of this process that ended (or failed) is dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    return start == "-" or _start_time(pid) in ("", start)


def stale_trial_ids(trials: Iterable[FrozenTrial], heartbeats: Callable[[FrozenTrial], float | None],
                    grace_s: float) -> list[int]:
    """RUNNING trials whose owner died on this machine, or whose last sign of life is older than ``grace_s``."""
    now = time.time()
    stale = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        owner = t.system_attrs.get(OWNER_ATTR)
        alive = owner_alive(owner) if isinstance(owner, str) else None
        if alive is False:
            stale.append(t._trial_id)
            continue
        if alive is True:
            continue
        beat = heartbeats(t)
        if beat is None and t.datetime_start is not None:
            beat = t.datetime_start.timestamp()
        if beat is not None and now - beat > grace_s:
            stale.append(t._trial_id)
    return stale


def ask_owned(study: optuna.Study, owner: str, params: dict | None = None,
              distributions: dict | None = None) -> optuna.trial.Trial:
    """``study.ask()`` with the owner stored by the same storage call that creates the trial.

    Why not ask, then record the owner: between the two writes (``Trial`` reads the
    trial back and runs the sampler's ``before_trial``; with a database each is a
    round trip) a worker killed with SIGKILL left a RUNNING trial with no owner,
    failed only after ``GRACE_S``. A trial enqueued earlier (``enqueue_trial``) is
    popped first, as ``ask`` does, and owned right after the pop. ``params`` creates
    the trial with those parameters (a plan chosen without the sampler).
    """
    study._thread_local.cached_all_trials = None  # as ask: read the storage afresh
    trial_id = study._pop_waiting_trial_id() if params is None else None
    if trial_id is None:
        template = optuna.trial.create_trial(state=TrialState.RUNNING, params=params or {},
                                             distributions=distributions or {}, system_attrs={OWNER_ATTR: owner})
        trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    else:
        study._storage.set_trial_system_attr(trial_id, OWNER_ATTR, owner)
    return optuna.trial.Trial(study, trial_id)


def ask_beaten(study: optuna.Study, heartbeat: "HeartbeatKeeper | None") -> optuna.trial.Trial:
    """A new trial; with a heartbeat keeper, owned from its creation and beaten for from then on."""
    if heartbeat is None:
        return study.ask()
    trial = ask_owned(study, heartbeat.owner)
    heartbeat.add(trial._trial_id)
    return trial


class HeartbeatKeeper:
    """One thread that refreshes the heartbeat of every trial this process is running.

    Optuna's own ``HeartbeatThread`` serves one trial of ``study.optimize``; a
    search keeps a batch (or a Ray worker pool) of trials in flight, so one
    thread beats for all of them through the same ``record_heartbeat`` call.
    """

    def __init__(self, storage: optuna.storages.BaseStorage, interval_s: float) -> None:
        self.session = uuid.uuid4().hex[:12]
        self.owner = this_owner(self.session)
        self._storage = storage
        self._interval = interval_s
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="stageopt-heartbeat", daemon=True)

    def __enter__(self) -> HeartbeatKeeper:
        _ACTIVE_SESSIONS.add(self.session)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE_SESSIONS.discard(self.session)
        self._stop.set()
        self._thread.join(timeout=5)

    def add(self, trial_id: int) -> None:
        with self._lock:
            self._running.add(trial_id)

    def discard(self, trial_id: int) -> None:
        """Stop beating for ``trial_id``; once this returns no beat for it is under way (tell it now)."""
        with self._lock:
            self._running.discard(trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                for trial_id in sorted(self._running):
                    try:
                        self._storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
                    except (UpdateFinishedTrialError, KeyError):
                        self._running.discard(trial_id)
                    except Exception:  # noqa: BLE001 - a failed beat must not end the search; the next one retries
                        pass
