"""Where candidates are evaluated: in-process and vectorized (analytical), or as Ray tasks (replay, ASTRA-sim).

Why two: the analytical model evaluates thousands of plans per second when given
a batch at once, so it runs in the search process; the event replay and ASTRA-sim
take 0.1 s to minutes per plan, so they run one task per CPU on a local Ray
started quietly or on a cluster. A task that raises, times out or whose worker
dies comes back as a reason string, and the search tells a FAIL trial and goes on.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from stageopt.errors import ConfigError
from stageopt.hardware import Hardware
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.search.candidate import Candidate, HardwareCatalog
from stageopt.search.reaper import TASK_MARK, Watchdog, kill_marked
from stageopt.sim.analytical import estimate_from_row
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.sim.base import Estimate, Simulator


def analytical_estimates(catalog: HardwareCatalog, cands: Sequence[Candidate]) -> list[Estimate]:
    """One vectorized analytical call per hardware choice and model; estimates in input order."""
    out: list[Estimate | None] = [None] * len(cands)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cands):
        groups.setdefault((c.hw_key, c.model.seq), []).append(i)
    for (hw_key, _), index in groups.items():
        hw = catalog.get(hw_key)
        result = evaluate_plans(cands[index[0]].model, hw, [cands[i].plan for i in index])
        for row, i in enumerate(index):
            out[i] = estimate_from_row(result, row, hw)
    return out  # type: ignore[return-value]


def run_in_temp_dir(simulator: Simulator, model: ModelSpec, plan: Plan, gpus: int, hw: Hardware,
                    task_mark: str = "") -> Estimate:
    """Evaluate one plan with its own temporary directory as cwd and TMPDIR (removed afterwards).

    ``task_mark`` goes into the environment of whatever the simulator starts, so
    a timed-out task's processes can be found and killed (:mod:`stageopt.search.reaper`).
    """
    from stageopt.workload import build_workload

    saved = {k: os.environ.get(k) for k in ("TMPDIR", TASK_MARK)}
    old_cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="stageopt-task-") as tmp:
        os.chdir(tmp)
        os.environ["TMPDIR"] = tmp
        os.environ[TASK_MARK] = task_mark
        tempfile.tempdir = tmp
        try:
            return simulator.evaluate(build_workload(model, plan, gpus), hw)
        finally:
            os.chdir(old_cwd)
            tempfile.tempdir = None
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@dataclass
class _Task:
    tag: Any
    started: float
    mark: str


class RayExecutor:
    """Runs ``simulator.evaluate`` for candidates as Ray tasks of one CPU each.

    ``poll`` returns ``(tag, Estimate | reason)`` pairs as tasks finish. A task
    running longer than ``timeout_s`` is cancelled with force (its worker process
    is killed; ASTRA-sim's runner also kills its own process group on the same limit).
    """

    def __init__(self, simulator: Simulator, *, workers: int | None, address: str | None = None,
                 timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self._owns_ray = not _ray_running()
        self._watchdog = Watchdog() if self._owns_ray and address in (None, "local") else None
        if self._watchdog is not None:
            self._watchdog.arm()  # a local Ray we start dies with us, even by SIGKILL
        try:
            ray = _start_ray(workers or os.cpu_count() or 1, address)
        except BaseException:
            self._disarm()
            raise
        self._ray = ray
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_in_temp_dir)
        self._simulator = ray.put(simulator)
        self._pending: dict[Any, _Task] = {}

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, tag: Any, cand: Candidate, hw: Hardware) -> None:
        mark = uuid.uuid4().hex
        ref = self._remote.remote(self._simulator, cand.model, cand.plan, cand.gpus, hw, mark)
        self._pending[ref] = _Task(tag=tag, started=time.monotonic(), mark=mark)

    def poll(self, wait_all: bool = False) -> list[tuple[Any, Estimate | str]]:
        """Block until at least one task (or, with ``wait_all``, every task) finished or timed out."""
        ray = self._ray
        done_out: list[tuple[Any, Estimate | str]] = []
        while self._pending:
            refs = list(self._pending)
            oldest = min(t.started for t in self._pending.values())
            wait_s = max(0.01, oldest + self.timeout_s - time.monotonic())
            ready, _ = ray.wait(refs, num_returns=len(refs) if wait_all else 1, timeout=min(wait_s, 1.0))
            for ref in ready:
                task = self._pending.pop(ref)
                done_out.append((task.tag, self._result(ref)))
            now = time.monotonic()
            for ref, task in list(self._pending.items()):
                if now - task.started > self.timeout_s:
                    ray.cancel(ref, force=True)
                    kill_marked(TASK_MARK, task.mark)  # the simulator's processes, setsid ones included
                    self._pending.pop(ref)
                    done_out.append((task.tag, f"timeout: no result after {self.timeout_s:g} s (worker killed)"))
            if done_out and not (wait_all and self._pending):
                break
        return done_out

    def _result(self, ref: Any) -> Estimate | str:
        try:
            return self._ray.get(ref)
        except Exception as err:  # noqa: BLE001 - any task error becomes a FAIL trial with its reason
            return _reason(err)

    def close(self) -> None:
        for ref, task in list(self._pending.items()):
            self._ray.cancel(ref, force=True)
            kill_marked(TASK_MARK, task.mark)
        self._pending.clear()
        if self._owns_ray:  # a Ray we started goes with the search (its notices before our output)
            self._ray.shutdown()
        self._disarm()

    def _disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.disarm()
            self._watchdog = None


def _ray_running() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def _reason(err: BaseException) -> str:
    """One line saying why a task failed (the simulator's own message when it raised one)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        err = cause
    text = str(err).strip().splitlines()
    name = type(err).__name__
    if "WorkerCrashed" in name or "ActorDied" in name or "died" in (text[0] if text else ""):
        return f"worker crashed ({name})"
    return f"{name}: {text[-1] if text else ''}"[:300]


def _start_ray(workers: int, address: str | None) -> Any:
    """Connect to ``address`` (checked reachable first, so a typo fails fast) or start a quiet local Ray."""
    import logging

    try:
        import ray
    except ImportError as err:
        raise ConfigError(f"Ray is not importable ({err}); pip install 'ray>=2.9'") from None
    if ray.is_initialized():
        return ray
    if address not in (None, "auto", "local"):
        host, port = _host_port(address)
        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError as err:
            raise ConfigError(f"--ray-address/RAY_ADDRESS {address}: cannot reach {host}:{port} "
                              f"({err.strerror or err}); start one with 'ray start --head' or drop "
                              "--ray-address and RAY_ADDRESS for a local Ray") from None
    try:
        if address is None or address == "local":  # "local": RAY_ADDRESS in the environment must not redirect it
            ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, configure_logging=True,
                     _node_ip_address="127.0.0.1")  # our own Ray listens on loopback only
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as err:  # noqa: BLE001 - Ray raises many types; the user needs one line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"Ray failed to start{' at ' + address if address else ''}: {first[:200]}; "
                          "check --ray-address, or run with --workers 1") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    default = 10001 if address.startswith("ray://") else 6379
    if not parsed.hostname:
        raise ConfigError(f"--ray-address {address!r}: expected host:port or ray://host:port")
    try:
        return parsed.hostname, parsed.port or default
    except ValueError:
        raise ConfigError(f"--ray-address {address!r}: port is not a number") from None
