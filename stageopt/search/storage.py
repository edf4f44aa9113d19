"""Where a study lives: a journal file in ``runs/<study>/`` by default, or a database shared by many workers.

Why a journal file: it is append-only (a killed search loses nothing it told),
needs no server, and optuna-dashboard opens it (:mod:`stageopt.search.journal`
keeps it whole through crashes, full disks and corruption). A database
(``postgresql://``, ``sqlite:///``) is for sharing one study between machines.

Either way the storage carries Optuna's heartbeat (:mod:`stageopt.search.workers`)
so that a worker that died has its running trials failed by the others, and a
*claim lock* that makes "is this plan already taken? then I take it" atomic
across processes: ``flock`` beside a journal or SQLite file, an advisory lock on
PostgreSQL.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock
from optuna.trial import FrozenTrial, TrialState

from stageopt.errors import ConfigError
from stageopt.search.journal import (
    FlockLock,
    JournalError,
    PrefixJournal,
    StudyJournal,
    os_error_line,
    repair_journal,
    scan_journal,
    tail_state,
)
from stageopt.search.workers import GRACE_S, HEARTBEAT_ATTR, HEARTBEAT_INTERVAL_S, STALE_CHECK_EVERY_S, stale_trial_ids

JOURNAL_NAME = "journal.log"
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class _StaleCheckMixin:
    """Rate-limits the stale-trial check (``Study.ask`` runs it on every ask when heartbeats are on)."""

    _last_check: dict[int, float]

    def _rate_limited(self, study_id: int, find: Callable[[], list[int]]) -> list[int]:
        now = time.monotonic()
        if now - self._last_check.get(study_id, -1e9) < STALE_CHECK_EVERY_S:
            return []
        self._last_check[study_id] = now
        return find()


class JournalStudyStorage(_StaleCheckMixin, JournalStorage, BaseHeartbeat):
    """Optuna's journal storage plus heartbeats (a trial system attribute) and stale-trial detection."""

    def __init__(self, backend: Any, interval_s: int = HEARTBEAT_INTERVAL_S, grace_s: int = GRACE_S) -> None:
        self._interval, self._grace, self._last_check = interval_s, grace_s, {}
        super().__init__(backend)

    def _sync_with_backend(self) -> None:
        try:
            super()._sync_with_backend()
        except (ValueError, AssertionError, TypeError) as err:  # a record written after we opened the file
            path = getattr(self._backend, "path", "the journal")
            raise JournalError(f"{path}: a record became unreadable while the search ran ({type(err).__name__}); "
                               "stop the workers and run again with --resume to repair it") from None

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        def find() -> list[int]:
            running = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            return stale_trial_ids(running, lambda t: t.system_attrs.get(HEARTBEAT_ATTR), self._grace)

        return self._rate_limited(study_id, find)

    def get_heartbeat_interval(self) -> int | None:
        return self._interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return None


class RDBStudyStorage(_StaleCheckMixin, RDBStorage):
    """Optuna's RDB storage with its heartbeat, plus: a dead owner on this machine, or no beat at all, is stale."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._last_check = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: stable since 2.9
            super().__init__(url, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=GRACE_S, **kwargs)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        def find() -> list[int]:
            by_heartbeat = set(super(RDBStudyStorage, self)._get_stale_trial_ids(study_id))
            running = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            beating = self._beating_trial_ids([t._trial_id for t in running])
            others = stale_trial_ids([t for t in running if t._trial_id not in beating], lambda t: None, GRACE_S)
            return sorted(by_heartbeat | set(others))

        return self._rate_limited(study_id, find)

    def set_trial_attrs(self, trial_id: int, user: Mapping[str, Any], system: Mapping[str, Any]) -> None:
        """Many attributes of one running trial in one transaction (Optuna writes one per transaction)."""
        import json

        import sqlalchemy
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(self.scoped_session, True) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            self.check_trial_is_updatable(trial_id, trial.state)
            for model, attrs in ((models.TrialUserAttributeModel, user), (models.TrialSystemAttributeModel, system)):
                if not attrs:
                    continue
                session.execute(sqlalchemy.delete(model).where(model.trial_id == trial_id, model.key.in_(list(attrs))))
                session.execute(sqlalchemy.insert(model), [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                                           for k, v in attrs.items()])

    def _beating_trial_ids(self, trial_ids: list[int]) -> set[int]:
        if not trial_ids:
            return set()
        import sqlalchemy

        query = sqlalchemy.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
            sqlalchemy.bindparam("ids", expanding=True))
        with self.engine.connect() as conn:
            return {row[0] for row in conn.execute(query, {"ids": trial_ids})}


class _AdvisoryLock:
    """PostgreSQL session advisory lock on a dedicated connection (released by the server if we die)."""

    def __init__(self, engine: Any, name: str) -> None:
        self._engine = engine
        self._key = int.from_bytes(hashlib.sha1(f"stageopt:{name}".encode()).digest()[:8], "big", signed=True)
        self._conn: Any = None

    def __enter__(self) -> None:
        import sqlalchemy

        self._conn = self._engine.connect()
        self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})

    def __exit__(self, *exc: object) -> None:
        import sqlalchemy

        try:
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            self._conn.commit()
        finally:
            self._conn.close()
            self._conn = None


class _ReadOnlyLock(BaseJournalFileLock):
    def acquire(self) -> bool:
        raise JournalError("the journal was opened read-only (report); run 'stageopt search --resume' to write")

    def release(self) -> None:
        pass


@dataclass
class StudyStorage:
    """An opened storage: what Optuna gets, how to flush it, and the cross-process claim lock."""

    storage: optuna.storages.BaseStorage
    location: str
    journal: StudyJournal | None = None
    claim_lock: ContextManager[Any] = field(default_factory=contextlib.nullcontext)
    notes: list[str] = field(default_factory=list)

    def sync(self) -> None:
        if self.journal is not None:
            self.journal.sync()


def check_study_name(name: str) -> str:
    if not _STUDY_NAME.match(name):
        raise ConfigError(f"--study-name {name!r}: use letters, digits, '.', '_' or '-' (it names a folder)")
    return name


def open_storage(url: str | None, run_dir: Path, *, write: bool = True) -> StudyStorage:
    """The storage for ``--storage URL``, or the journal file in ``run_dir``; a damaged journal is recovered."""
    if url is None or (url.endswith((".log", ".jsonl")) and "://" not in url):
        path = Path(url) if url else run_dir / JOURNAL_NAME
        if write:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise JournalError(os_error_line(path.parent, err, "create the study folder")) from None
        return _open_journal(str(path), write)
    if "://" not in url:
        raise ConfigError(f"--storage {url!r} is not a URL; give e.g. postgresql://user@host/db, "
                          "sqlite:///study.db, or a journal file path ending in .log")
    return _open_rdb(url, create=write)


def _replay(backend: Any) -> tuple[JournalStudyStorage | None, int | None]:
    """Replay the journal with Optuna; the storage and the byte offset it read up to (None: it could not)."""
    try:
        storage = JournalStudyStorage(backend)
    except (ValueError, KeyError, AssertionError, TypeError, JournalError):
        return None, None
    return storage, backend._log_number_offset.get(storage._replay_result.log_number_read)


def _warn(notes: list[str]) -> list[str]:
    for note in notes:
        print(f"stageopt: warning: {note}", file=sys.stderr)
    return notes


def _cut_note(path: str, verb: str) -> str:
    return f"{path}: the last record was cut mid-line (crash or full disk); {verb} it (1 record)"


def _open_journal(path: str, write: bool) -> StudyStorage:
    """Replay the journal; check and repair its tail with the lock held, so a live worker's append is never cut."""
    if not write:
        return _open_journal_read_only(path)
    backend = StudyJournal(path)
    storage, _ = _replay(backend)
    notes = []
    with backend.locked():
        end = None
        if storage is not None:
            try:
                storage._sync_with_backend()  # what was appended since, now that no one writes
                end = backend._log_number_offset.get(storage._replay_result.log_number_read)
            except JournalError:
                end = None
        state = tail_state(path, end, locked=True)
        if state == "cut":
            backend.truncate(end)  # type: ignore[arg-type]
            notes.append(_cut_note(path, "dropped"))
        elif state == "bad" or storage is None:
            notes.append(repair_journal(backend, scan_journal(path)))
            backend._log_number_offset = {0: 0}
            storage = JournalStudyStorage(backend)
    return StudyStorage(storage, path, backend, FlockLock(path + ".claim"), _warn(notes))


def _open_journal_read_only(path: str) -> StudyStorage:
    """For ``report``: never writes; a damaged journal is read up to its last good record."""
    if not Path(path).is_file():
        raise ConfigError(f"{path}: no journal here; give a runs/<study> folder or --storage URL")
    backend = JournalFileBackend(path, lock_obj=_ReadOnlyLock())
    storage, end = _replay(backend)
    state = tail_state(path, end, locked=False) if storage is not None else "bad"
    if state != "bad" and storage is not None:
        notes = [_cut_note(path, "skipped")] if state == "cut" else []
        return StudyStorage(storage, path, None, contextlib.nullcontext(), _warn(notes))
    prefix = PrefixJournal(path, scan_journal(path))
    return StudyStorage(JournalStudyStorage(prefix), path, None, contextlib.nullcontext(), _warn([prefix.note]))


def postgres_url(url: str) -> str:
    """``postgresql://`` with the driver that is installed (SQLAlchemy's default differs between 2.0 and 2.1)."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}{sep}{rest}"
    raise ConfigError(f"--storage {url!r}: no PostgreSQL driver is installed; pip install 'stageopt[postgres]'")


def _open_rdb(url: str, create: bool = True) -> StudyStorage:
    real = postgres_url(url)
    try:
        with _schema_lock(real):  # two workers on a fresh database would both create Optuna's tables
            storage = RDBStudyStorage(real, engine_kwargs=_engine_kwargs(real), skip_table_creation=not create)
    except ImportError as err:
        raise ConfigError(f"--storage {url!r}: database driver missing ({err}); for PostgreSQL "
                          "pip install 'stageopt[postgres]'") from None
    except Exception as err:  # noqa: BLE001 - sqlalchemy raises many types; one line for the user
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--storage {url!r}: cannot open ({first[:200]}); check the URL and that the "
                          "database is reachable") from None
    if real.startswith("postgresql"):
        lock: ContextManager[Any] = _AdvisoryLock(storage.engine, url)
    elif real.startswith("sqlite:///") and real != "sqlite:///:memory:":
        lock = FlockLock(real.removeprefix("sqlite:///") + ".claim")
    else:
        lock = contextlib.nullcontext()  # other databases: claims are written but not locked (see README)
    return StudyStorage(storage, url, None, lock)


@contextlib.contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """On PostgreSQL, hold an advisory lock while Optuna creates or checks its tables."""
    if not url.startswith("postgresql"):
        yield
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, **_engine_kwargs(url))
    try:
        with _AdvisoryLock(engine, "schema"):
            yield
    finally:
        engine.dispose()


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("postgresql") or url.startswith("mysql"):
        return {"connect_args": {"connect_timeout": 5}}
    return {}


def study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    return any(s.study_name == name for s in storage.get_all_studies())
