"""The study's journal file: Optuna's ``JournalFileBackend`` with a kernel lock, batched fsync and repair.

Why not Optuna's backend unchanged: it fsyncs every operation (~2 ms each, a few
dozen per trial), and its lock objects are lock *files* meant for NFS: a process
killed inside ``append_logs`` leaves the file behind and every other worker waits
out a grace period. Here the lock is an ``flock`` (the kernel drops it when its
holder dies; Optuna's ``JournalFileOpenLock`` is the fallback where the file
system refuses flock), each append is one ``write`` to an ``O_APPEND`` file, and
the search fsyncs once per batch (:meth:`StudyJournal.sync`).

Damage is repaired, never fatal:

* a last line cut by a crash or a full disk is dropped before the next append
  (under the lock, so another worker never appends to half a record);
* a write that fails (disk full, read-only file) is cut back to where it started
  and raised as a one-line :class:`JournalError`;
* a journal Optuna cannot replay (a bad JSON line, binary bytes, an unknown op
  code, a malformed record) is kept up to its last good record; the records
  after it are moved aside to ``journal.log.dropped-<time>`` (or, read-only, left
  alone and skipped) and one warning line says how many.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._base import BaseJournalBackend
from optuna.storages.journal._file import BaseJournalFileLock
from optuna.storages.journal._storage import JournalOperation, JournalStorageReplayResult

from stageopt.errors import StageoptError


class JournalError(StageoptError):
    """The journal cannot be written or read (disk full, read-only, corrupted while running)."""


def os_error_line(path: str | Path, err: OSError, doing: str) -> str:
    """One line for a failed file operation, naming the cause a user can fix."""
    why = err.strerror or str(err)
    if err.errno == errno.ENOSPC or err.errno == errno.EDQUOT:
        fix = "free space (or point --runs-dir/--storage elsewhere) and continue with --resume"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable (chmod, chattr -i, a writable mount) or choose another --runs-dir"
    else:
        fix = "check the file system, then continue with --resume"
    return f"{path}: cannot {doing} ({why}); {fix}"


class FlockLock(BaseJournalFileLock):
    """An exclusive ``flock`` on a side file, as an Optuna journal lock: released by the kernel if the holder dies."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FlockLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def journal_lock(path: str) -> BaseJournalFileLock:
    """flock where the file system supports it, else Optuna's lock file (NFS without lock support)."""
    lock = FlockLock(path + ".lock")
    try:
        lock.acquire()
        lock.release()
        return lock
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return JournalFileOpenLock(path, grace_period=10)
        raise JournalError(os_error_line(path + ".lock", err, "create the journal lock")) from None


class StudyJournal(JournalFileBackend):
    """Journal file backend: single-write appends under a kernel lock, fsync per batch, cut tails repaired."""

    def __init__(self, path: str) -> None:
        try:
            if not os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        except OSError as err:
            raise JournalError(os_error_line(path, err, "create the journal")) from None
        super().__init__(path, lock_obj=journal_lock(path))
        self.path = path

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        self._lock.acquire()
        try:
            self._append(data)
        finally:
            self._lock.release()

    def _append(self, data: bytes) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as err:
            raise JournalError(os_error_line(self.path, err, "append to the journal")) from None
        try:
            start = _drop_cut_tail(fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as err:
                os.ftruncate(fd, start)  # never leave half a record for the next writer
                raise JournalError(os_error_line(self.path, err, "append to the journal")) from None
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the journal lock: no worker appends meanwhile, so the file can be checked and repaired."""
        self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (with the lock held) and forget read offsets past it."""
        try:
            os.truncate(self.path, size)
        except OSError as err:
            raise JournalError(os_error_line(self.path, err, "repair the journal")) from None
        self._log_number_offset = {n: off for n, off in self._log_number_offset.items() if off <= size}

    def sync(self) -> None:
        """Flush the journal to disk (once per batch of told trials)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as err:
            raise JournalError(os_error_line(self.path, err, "flush the journal")) from None


def _drop_cut_tail(fd: int) -> int:
    """Truncate a last line that has no newline (a write cut by a crash); return the file size after."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    chunk = 1 << 16
    pos = size
    while pos > 0:
        start = max(0, pos - chunk)
        block = os.pread(fd, pos - start, start)
        nl = block.rfind(b"\n")
        if nl >= 0:
            os.ftruncate(fd, start + nl + 1)
            return start + nl + 1
        pos = start
    os.ftruncate(fd, 0)
    return 0


# ----------------------------------------------------------------------------- reading damaged journals


@dataclass(frozen=True, slots=True)
class JournalScan:
    """Where a journal stops being replayable: the good prefix and what follows it."""

    good_records: int
    good_end: int  # byte offset just after the last good record
    dropped: int  # records (lines, a cut last line included) from good_end on
    problem: str  # why the first dropped record is bad; "" when nothing is dropped


_KNOWN_OPS = {int(op) for op in JournalOperation}


def scan_journal(path: str) -> JournalScan:
    """Replay the journal with Optuna's own replay and find the first record it cannot apply."""
    replay = JournalStorageReplayResult("stageopt-scan-")
    good, offset, problem = 0, 0, ""
    with open(path, "rb") as f:
        for line in f:
            problem = _record_problem(line, replay)
            if problem:
                break
            good += 1
            offset += len(line)
        dropped = (1 if problem else 0) + sum(1 for _ in f)
    return JournalScan(good_records=good, good_end=offset, dropped=dropped, problem=problem)


def _record_problem(line: bytes, replay: JournalStorageReplayResult) -> str:
    if not line.endswith(b"\n"):
        return "the last record was cut mid-line (crash or full disk)"
    try:
        log = json.loads(line)
    except UnicodeDecodeError:
        return "binary bytes (not UTF-8)"
    except ValueError:
        return "a line that is not JSON"
    if not isinstance(log, dict) or log.get("op_code") not in _KNOWN_OPS:
        return f"an unknown op code {log.get('op_code') if isinstance(log, dict) else type(log).__name__!r}"
    try:
        replay.apply_logs([log])
    except Exception as err:  # noqa: BLE001 - anything Optuna's replay rejects ends the good prefix
        return f"a record Optuna cannot apply ({type(err).__name__}: {str(err)[:80]})"
    return ""


def tail_state(path: str, end: int | None, *, locked: bool) -> str:
    """What follows the last record a replay consumed (byte ``end``): "" nothing, "cut" half a record, "bad".

    With the lock held no one is writing, so any complete line Optuna did not
    consume is bad; without it (a read-only ``report``) complete lines may be
    records that a live worker appended meanwhile, and only unparsable ones are bad.
    """
    if end is None:
        return "bad"
    with open(path, "rb") as f:
        f.seek(end)
        rest = f.read()
    if not rest:
        return ""
    *complete, last = rest.split(b"\n")
    if locked and complete:
        return "bad"
    for line in complete:
        try:
            log = json.loads(line)
        except ValueError:
            return "bad"
        if not isinstance(log, dict) or log.get("op_code") not in _KNOWN_OPS:
            return "bad"
    return "cut" if last else ""


def repair_journal(backend: StudyJournal, scan: JournalScan) -> str:
    """Move the records after the good prefix aside and truncate (call with the lock held); return the warning."""
    path = backend.path
    aside = f"{path}.dropped-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        with open(path, "rb") as src, open(aside, "wb") as dst:
            src.seek(scan.good_end)
            shutil.copyfileobj(src, dst)
    except OSError as err:
        raise JournalError(os_error_line(path, err, "repair the journal")) from None
    backend.truncate(scan.good_end)
    return (f"{path}: record {scan.good_records + 1} is {scan.problem}; kept the {scan.good_records:,} records "
            f"before it, dropped {scan.dropped:,} (moved to {aside})")


class PrefixJournal(BaseJournalBackend):
    """A read-only view of a journal's good prefix (``report`` on a damaged journal leaves the file alone)."""

    def __init__(self, path: str, scan: JournalScan) -> None:
        with open(path, "rb") as f:
            self._lines = f.read(scan.good_end).splitlines()
        self.note = (f"{path}: record {scan.good_records + 1} is {scan.problem}; read the {scan.good_records:,} "
                     f"records before it and skipped {scan.dropped:,} (the file is left as it is)")

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        for line in self._lines[log_number_from:]:
            yield json.loads(line)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise JournalError("this view of a damaged journal is read-only; run 'stageopt search --resume' to repair it")
