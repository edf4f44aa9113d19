"""No orphans: find and kill every process a search started, by a mark in its environment.

Why the environment: Ray's own processes leave our process group and outlive
their parent when the search is killed with SIGKILL; a simulator may ``setsid``
its children. The environment is inherited by all of them and kept through new
sessions and re-parenting, so a mark set before they start finds them (on this
machine; a remote cluster's nodes are that cluster's business). Processes that
rename themselves with ``setproctitle`` (``ray::DashboardAgent``) may overwrite
their environment as /proc shows it, so the watchdog also records the process
tree under the search while it lives and kills what is left of it.

* :func:`kill_marked` kills the processes that carry ``NAME=value`` (a timed-out
  task's simulator and its children);
* :class:`Watchdog` is a tiny process that outlives the search: when the search
  ends, normally or by SIGKILL, it kills whatever still carries the search's mark
  (the local Ray it started, with its agents and workers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

MARK = "STAGEOPT_SEARCH_MARK"
TASK_MARK = "STAGEOPT_TASK_MARK"

_WATCHER = r"""
import os, select, signal, sys, time
name, value, grace, parent = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3]), int(sys.argv[4])
needle = name.encode() + b"=" + value


def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]
    except (OSError, IndexError, ValueError):
        return None


# Every process now under root joins known; the walk goes through the ones known already (a raylet
# recorded before it started its agents must still lead to them).
def descendants(root, known):
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := stat(entry)) is not None:
            parents[int(entry)] = st
    frontier, seen = [root], {root, os.getpid()}
    while frontier:
        pid = frontier.pop()
        for child, (ppid, start) in parents.items():
            if ppid == pid and child not in seen:
                seen.add(child)
                known[child] = start
                frontier.append(child)


# Processes that rename themselves (setproctitle) may lose their environment in /proc, so the tree under
# the search is also recorded while it lives: Ray's agents are the raylet's children.
known = {}
while True:
    ready, _, _ = select.select([sys.stdin.buffer], [], [], 1.0)
    if ready and not os.read(sys.stdin.fileno(), 4096):
        break  # the search's end of the pipe closed: it exited or was killed
    descendants(parent, known)
time.sleep(grace)
quiet, deadline = 0, time.monotonic() + 60
while quiet < 3 and time.monotonic() < deadline:  # until three sweeps in a row find nothing (Ray respawns)
    found = 0
    for pid, start in list(known.items()):
        st = stat(pid)
        if st is not None and st[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
                found += 1
            except OSError:
                pass
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
                    found += 1
        except OSError:
            pass
    quiet = 0 if found else quiet + 1
    time.sleep(0.5)
"""


def marked_pids(name: str, value: str) -> list[int]:
    """PIDs of this machine's processes whose environment has ``name=value`` (never this process)."""
    needle = f"{name}={value}".encode()
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out


def kill_marked(name: str, value: str) -> int:
    """SIGKILL every process marked ``name=value``; returns how many were found."""
    pids = marked_pids(name, value)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


class Watchdog:
    """Marks the processes started after :meth:`arm` and kills them once this process is gone.

    The watcher is started first (so it does not carry the mark) in its own
    session (so a Ctrl-C to the terminal reaches the search, which shuts down in
    order, and not the watcher); it waits for the end of a pipe only the search
    holds, then kills what is left.
    """

    def __init__(self, grace_s: float = 1.0) -> None:
        self.value = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._proc: subprocess.Popen | None = None
        self._grace_s = grace_s

    def arm(self) -> None:
        if not os.path.isdir("/proc"):
            return  # no /proc (macOS): Ray's own cleanup only
        self._proc = subprocess.Popen([sys.executable, "-c", _WATCHER, MARK, self.value, str(self._grace_s),
                                       str(os.getpid())],
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True, close_fds=True)
        os.environ[MARK] = self.value

    def disarm(self) -> None:
        """The processes it guards were shut down in order: let the watcher sweep up and exit."""
        os.environ.pop(MARK, None)
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            self._proc = None
