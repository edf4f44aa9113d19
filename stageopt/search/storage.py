"""Where a study lives: a journal file under ``runs/<study>/`` by default, or any RDB URL.

Why a journal file: it is append-only (a killed search loses nothing it told),
needs no server, and optuna-dashboard opens it. Optuna's file backend fsyncs
every operation (~3 ms each, about a dozen per trial); :class:`CrashSafeJournal`
writes each operation with one ``write`` to an ``O_APPEND`` file under an
``flock`` (which the kernel releases when a process dies, so a ``kill -9`` leaves
no stale lock) and fsyncs once per batch. A killed process loses nothing it
wrote; only a machine crash could lose the last batch. SQLite was measured at
~120 ms per trial, so RDB URLs are for sharing a study (PostgreSQL).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock

from stageopt.errors import ConfigError

JOURNAL_NAME = "journal.log"
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class _FlockLock(BaseJournalFileLock):
    """An exclusive ``flock`` on a side file: released by the kernel if the holder dies."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class CrashSafeJournal(JournalFileBackend):
    """Journal file whose appends are single writes (whole lines) and fsynced by :meth:`sync`."""

    def __init__(self, path: str) -> None:
        _repair_tail(Path(path))
        super().__init__(path, lock_obj=_FlockLock(path + ".flock"))
        self._path = path

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        lock = self._lock
        lock.acquire()
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        finally:
            lock.release()

    def sync(self) -> None:
        """Flush the journal to disk (called once per batch of told trials)."""
        fd = os.open(self._path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _repair_tail(path: Path) -> None:
    """Drop a last line left unterminated by a crash mid-write (it would corrupt the next append)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def check_study_name(name: str) -> str:
    if not _STUDY_NAME.match(name):
        raise ConfigError(f"--study-name {name!r}: use letters, digits, '.', '_' or '-' (it names a folder)")
    return name


def make_storage(url: str | None, run_dir: Path) -> tuple[optuna.storages.BaseStorage, CrashSafeJournal | None]:
    """The Optuna storage for ``--storage URL``, or the journal file in ``run_dir``."""
    if url is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        backend = CrashSafeJournal(str(run_dir / JOURNAL_NAME))
        return JournalStorage(backend), backend
    if url.endswith((".log", ".jsonl")) and "://" not in url:
        backend = CrashSafeJournal(url)
        return JournalStorage(backend), backend
    if "://" not in url:
        raise ConfigError(f"--storage {url!r} is not a URL; give e.g. postgresql://user@host/db, "
                          "sqlite:///study.db, or a journal file path ending in .log")
    try:
        return RDBStorage(url, engine_kwargs=_engine_kwargs(url)), None
    except ImportError as err:
        raise ConfigError(f"--storage {url!r}: database driver missing ({err}); install it, e.g. "
                          "pip install psycopg2-binary") from None
    except Exception as err:  # noqa: BLE001 - sqlalchemy raises many types; one line for the user
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--storage {url!r}: cannot open ({first[:200]}); check the URL and that the "
                          "database is reachable") from None


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("postgresql") or url.startswith("mysql"):
        return {"connect_args": {"connect_timeout": 5}}
    return {}


def study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    return any(s.study_name == name for s in storage.get_all_studies())


def fail_running(study: optuna.Study, storage: optuna.storages.BaseStorage) -> int:
    """Mark trials left RUNNING by a killed search as FAIL (their results were never told)."""
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in running:
        storage.set_trial_user_attr(t._trial_id, "reason", "left running by an interrupted search; failed on resume")
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    return len(running)
