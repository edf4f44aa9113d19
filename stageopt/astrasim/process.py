"""Run a simulator process so that nothing it starts outlives it, and read its output as a stream.

Why: a simulator is an external program that may hang, fork helpers (even
ones that call ``setsid`` and leave its process group), print without end, or
be orphaned when stageopt itself is told to stop. So a run here:

* starts the program in its own session (its own process group) and, on
  Linux, asks the kernel to kill it if the thread that started it dies;
* records the program's descendants while it runs (``/proc``), so a
  grandchild that moved to a new session, or whose parent already exited, is
  still known;
* on a timeout, on SIGTERM / SIGINT to stageopt, or when the program ends,
  stops the group and every recorded descendant (SIGSTOP first, so nothing
  forks while the list is completed) and then SIGKILLs them all;
* hands stdout to a callback line by line (lines capped at
  :data:`MAX_LINE_CHARS`; with ``wanted``, only lines that can matter) and
  keeps only the last :data:`TAIL_BYTES` of
  stderr, so memory does not grow with the output; more than
  :data:`OUTPUT_LIMIT_BYTES` on stdout stops the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINE_CHARS = 4096
TAIL_BYTES = 64 * 1024
OUTPUT_LIMIT_BYTES = 1 << 30
POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


class RunTimeout(Exception):
    """The process ran past its limit (it and its descendants were killed)."""


class OutputTooLarge(Exception):
    """The process printed more than :data:`OUTPUT_LIMIT_BYTES` (it was killed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Completed:
    """How a process ended: exit status, the tail of stderr, bytes printed, seconds run."""

    returncode: int
    stderr_tail: str
    stdout_bytes: int
    wall_s: float


def _children_map() -> dict[int, list[tuple[int, int]]]:
    """``{ppid: [(pid, start time), ...]}`` for every process now visible in /proc."""
    out: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[19])))
    return out


def descendants(pid: int) -> set[tuple[int, int]]:
    """``(pid, start time)`` of every live descendant of ``pid``."""
    kids = _children_map()
    found: set[tuple[int, int]] = set()
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def _stat(pid: int) -> tuple[int, int] | None:
    """``(process group, start time)`` of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


class ProcessTree:
    """A started process, its group and every descendant seen so far.

    The leader is never reaped before :meth:`kill` (exit is detected with
    ``WNOWAIT``), so its pid, which is also the group id, cannot be reused
    while the group is being killed; a recorded descendant is signalled only
    if its start time still matches (never a recycled pid).
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.seen: set[tuple[int, int]] = set()

    def exited(self) -> bool:
        """Whether the leader has exited (left unreaped)."""
        info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return info is not None and info.si_pid == self.proc.pid

    def track(self) -> None:
        self.seen |= descendants(self.proc.pid)

    def _alive(self) -> list[tuple[int, int]]:
        out = []
        for pid, start in self.seen:
            stat = _stat(pid)
            if stat is not None and stat[1] == start:
                out.append((pid, stat[0]))
        return out

    def kill(self) -> None:
        """Stop the group and all tracked descendants, complete the list, then SIGKILL everything."""
        pid = self.proc.pid
        _signal(pid, signal.SIGSTOP, group=True)
        for _ in range(5):  # a stopped process cannot fork, so the list converges
            before = len(self.seen)
            self.track()
            for child, _group in self._alive():
                self.seen |= descendants(child)
                _signal(child, signal.SIGSTOP)
            if len(self.seen) == before:
                break
        _signal(pid, signal.SIGKILL, group=True)
        for child, group in self._alive():
            _signal(child, signal.SIGKILL)
            if group == child:  # a session or group of its own (setsid): its members go too
                _signal(child, signal.SIGKILL, group=True)
        self.proc.wait()


def _death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the thread that started it dies (Linux).

    libc is resolved here, in the parent; the child only makes the call.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def read_lines(stream, limit: int, wanted: tuple[bytes, ...] = ()) -> Iterator[tuple[str, int, int]]:
    """``(line, line number, bytes so far)`` for each line (capped), never holding more than one chunk.

    With ``wanted``, a chunk holding none of those substrings is only counted,
    not split: a flood of output costs a substring search per 64 KiB.
    """
    total = number = 0
    partial = b""
    while chunk := stream.read1(65536):
        total += len(chunk)
        if total > limit:
            yield "", number, total
            return
        data = partial + chunk
        if wanted and not any(w in data for w in wanted):
            cut = data.rfind(b"\n")
            if cut >= 0:
                number += data.count(b"\n")
                data = data[cut + 1:]
            partial = data[:MAX_LINE_CHARS]
            continue
        parts = data.split(b"\n")
        partial = parts.pop()[:MAX_LINE_CHARS]
        for raw in parts:
            number += 1
            yield raw[:MAX_LINE_CHARS].decode("utf-8", "replace"), number, total
    if partial:
        yield partial.decode("utf-8", "replace"), number + 1, total


class _Pump(threading.Thread):
    """Reads one pipe to its end: stdout line by line into a callback, stderr into a bounded tail."""

    def __init__(self, stream, on_line: Callable[[str, int], None] | None, wanted: tuple[bytes, ...] = ()) -> None:
        super().__init__(daemon=True)
        self.stream, self.on_line, self.wanted = stream, on_line, wanted
        self.tail = b""
        self.total = 0
        self.too_large = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.on_line is None:
                while chunk := self.stream.read1(65536):
                    self.tail = (self.tail + chunk)[-TAIL_BYTES:]
                return
            for line, number, total in read_lines(self.stream, OUTPUT_LIMIT_BYTES, self.wanted):
                self.total = total
                if total > OUTPUT_LIMIT_BYTES:
                    self.too_large = True
                    return
                self.on_line(line, number)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            self.error = err


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """Turn SIGTERM into SystemExit(143) while a run is waited on, if nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_tree(argv: list[str], cwd: Path, timeout_s: float, on_line: Callable[[str, int], None],
             env: dict[str, str] | None = None, wanted: tuple[bytes, ...] = ()) -> Completed:
    """Run ``argv``; ``on_line(line, number)`` gets each stdout line (with ``wanted``, at least those
    holding one of its substrings). Nothing it started is left running on return."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_death_signal())
    tree = ProcessTree(proc)
    out, err = _Pump(proc.stdout, on_line, wanted), _Pump(proc.stderr, None)
    out.start()
    err.start()
    try:
        with _terminate_raises():
            deadline = start + timeout_s
            pause = 0.002
            while not tree.exited():
                if time.monotonic() > deadline:
                    raise RunTimeout
                if out.too_large:
                    raise OutputTooLarge
                tree.track()
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
                pause = min(pause * 2, POLL_S)
    finally:
        tree.kill()  # also after a normal exit: helpers it left behind go too
        out.join()
        err.join()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    if out.too_large:
        raise OutputTooLarge
    if out.error is not None:
        raise out.error
    return Completed(returncode=proc.returncode, stderr_tail=err.tail.decode("utf-8", "replace"),
                     stdout_bytes=out.total, wall_s=time.monotonic() - start)
