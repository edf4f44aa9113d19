"""The watchdog kills what a search started once the search dies by SIGKILL, including a grandchild that
appears after its parent was first seen and that carries no mark (as Ray's raylet starts its agents late,
and the agents rename themselves)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the watchdog reads /proc")

# A "search": arms the watchdog, starts a child; the child waits past the watchdog's first scans, then
# starts a grandchild with an empty environment (no mark) and writes its pid where the test reads it.
SEARCH = textwrap.dedent("""
    import subprocess, sys, time
    from stageopt.search.reaper import Watchdog
    Watchdog().arm()
    child = '''
    import subprocess, sys, time
    time.sleep(2.5)
    grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={})
    open(sys.argv[1], "w").write(str(grand.pid))
    time.sleep(120)
    '''
    subprocess.Popen([sys.executable, "-c", child, sys.argv[1]])
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_late_unmarked_grandchild_dies_with_the_search(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    search = subprocess.Popen([sys.executable, "-c", SEARCH, str(pid_file)], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    grand = 0
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not pid_file.exists():
            time.sleep(0.2)
        assert pid_file.exists(), "the child did not start its grandchild"
        time.sleep(0.5)
        while not pid_file.read_text():
            time.sleep(0.1)
        grand = int(pid_file.read_text())
        time.sleep(2.0)  # at least one scan of the watchdog sees the grandchild under the known child
        search.send_signal(signal.SIGKILL)
        search.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(grand):
            time.sleep(0.2)
        assert not _alive(grand), "the grandchild outlived the search"
    finally:
        search.kill()
        if grand and _alive(grand):
            os.kill(grand, signal.SIGKILL)
