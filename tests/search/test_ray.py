"""Ray executor: tasks run on workers, a crash/raise becomes a FAIL trial with its reason, the study goes on."""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HERE, REPO, SMALL, search_json


@pytest.fixture(scope="module", autouse=True)
def _ray_available():
    pytest.importorskip("ray")


def _run(runs: Path, backend: str, *extra: str) -> dict:
    try:
        return search_json("--space", str(SMALL), "--backend", backend, "--runs-dir", str(runs),
                           "--study-name", "ray", *extra, timeout=240,
                           env={"STAGEOPT_TEST_SLEEP_S": "0.05", "PYTHONPATH": str(HERE)})
    except AssertionError as err:
        if "Ray failed to start" in str(err):
            pytest.skip(f"Ray cannot start here: {err}")
        raise


def test_crashes_and_errors_become_fail_trials(tmp_path: Path) -> None:
    out = _run(tmp_path / "runs", "search_doubles:FlakySimulator", "--budget", "12", "--workers", "2", "--seed", "1",
               "--seed-plan", "tp=1 pp=1 mbs=1 zero=1 recompute=full sp=on", "--seed-plan", "tp=2 pp=1 mbs=1 zero=1 recompute=full sp=on")
    rows = list(csv.DictReader((tmp_path / "runs" / "ray" / "trials.csv").open()))
    failed = {r["tp"]: r["reason"] for r in rows if r["state"] == "FAIL"}
    assert "worker crashed" in failed["1"]
    assert "refuses tp=2" in failed["2"]
    assert out["failed"] >= 2 and out["simulations"] == 12
    assert out["mode"] == "confirm"  # the census ranks, the budget confirms (seed plans first)
    assert out["best"] and all(b["plan"].startswith(("tp=4", "tp=8")) for b in out["best"])


def test_timeouts_fail_and_the_study_continues(tmp_path: Path) -> None:
    out = _run(tmp_path / "runs", "search_doubles:HangSimulator", "--budget", "4", "--workers", "2", "--timeout", "2",
               "--seed-plan", "tp=8 pp=1 mbs=1 zero=1 recompute=full sp=on")
    rows = list(csv.DictReader((tmp_path / "runs" / "ray" / "trials.csv").open()))
    assert any("timeout" in r["reason"] for r in rows if r["state"] == "FAIL")
    assert out["simulations"] == 4


# ----------------------------------------------------------------------------- Ray as users run it


def _environ_pids(name: str, prefix: str) -> list[int]:
    """PIDs whose environment has ``name=<prefix>...`` (processes keep it through renames and re-parenting)."""
    needle = f"{name}={prefix}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if any(item.startswith(needle) for item in f.read().split(b"\0")):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _descendants(root: int) -> dict[int, str]:
    """Every live process under ``root`` (pid -> start time), from /proc's parent links."""
    parent, start = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(entry)], start[int(entry)] = int(fields[1]), fields[19]
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in found:
                found[child] = start[child]
                frontier.append(child)
    return found


def _alive(pids: dict[int, str]) -> list[int]:
    """Those of ``pids`` still running (same start time: not a reused PID; zombies count as gone)."""
    out = []
    for pid, start in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and fields[19] == start:
            out.append(pid)
    return out


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# Loopback only, and no token: Ray otherwise resolves 127.0.0.1 to the machine's address, and a token in
# ~/.ray (shared by everything on the machine) may change under the test.
_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


@contextlib.contextmanager
def _ray_head(probe: Path) -> Iterator[tuple[str, str]]:
    """``ray start --head`` on loopback, blocking, in its own session; stopped (and swept by its mark) afterwards."""
    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mark, temp = uuid.uuid4().hex, tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(HERE), STAGEOPT_TEST_CLUSTER=mark, STAGEOPT_TEST_SLEEP_S="0.05",
               STAGEOPT_TEST_PROBE_DIR=str(probe), **_LOOPBACK)
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp}"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and head.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.5)
        if head.poll() is not None:
            pytest.skip("ray start --head did not come up here")
        yield f"127.0.0.1:{port}", mark
    finally:
        head.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=30)
        _kill_all(_environ_pids("STAGEOPT_TEST_CLUSTER", mark))
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_address_from_the_environment_runs_on_that_cluster(tmp_path: Path) -> None:
    """What ``ray job submit`` sets: RAY_ADDRESS=host:port. The tasks must run on that cluster, not a new one."""
    probe = tmp_path / "probe"
    probe.mkdir()
    with _ray_head(probe) as (address, mark):
        out = search_json("--space", str(SMALL), "--backend", "search_doubles:SleepSimulator", "--budget", "6",
                          "--seed", "1", "--runs-dir", str(tmp_path / "runs"), "--study-name", "cluster",
                          timeout=240, env={"RAY_ADDRESS": address, "PYTHONPATH": str(HERE),
                                            "STAGEOPT_TEST_PROBE_DIR": str(probe), **_LOOPBACK})
        assert out["simulations"] == 6
        ran_on = {p.read_text() for p in probe.iterdir()}
        assert ran_on == {mark}  # every task ran in the cluster's workers (a local Ray would write "local")


def test_kill_9_of_a_search_leaves_no_ray_process_behind(tmp_path: Path) -> None:
    """The local Ray a search starts (GCS, raylet, dashboard and runtime-env agents, workers) dies with it."""
    runs = tmp_path / "runs"
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": str(HERE),
           "STAGEOPT_TEST_SLEEP_S": "0.5"}
    proc = subprocess.Popen([sys.executable, "-m", "stageopt.cli", "search", "--space", str(SMALL), "--backend",
                             "search_doubles:SleepSimulator", "--budget", "60", "--workers", "2", "--runs-dir",
                             str(runs), "--study-name", "k", "--no-plots"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tree: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            tree = _descendants(proc.pid)
            grandchildren = {c for c in tree if _parent(c) != proc.pid}
            if len(tree) >= 6 and grandchildren:  # gcs, raylet, ... and the raylet's agents and workers
                time.sleep(3)  # tasks under way
                tree = _descendants(proc.pid)
                break
            time.sleep(0.5)
        if proc.poll() is not None or len(tree) < 3:
            pytest.skip("the local Ray did not start here")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(tree):
            time.sleep(0.5)
        left = _alive(tree)
        names = [(Path(f"/proc/{p}/cmdline").read_bytes()[:30],
                  [e for e in Path(f"/proc/{p}/environ").read_bytes().split(b"\0") if e.startswith(b"STAGEOPT")],
                  _parent(p)) for p in left if Path(f"/proc/{p}").exists()]
        assert not left, f"still alive after the search was killed: {names}"
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
        _kill_all(_alive(tree))
        _kill_all(_environ_pids("STAGEOPT_SEARCH_MARK", f"{proc.pid}-"))


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
