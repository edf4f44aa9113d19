"""Stand-in simulators for the executor tests: slow, crashing or raising, otherwise analytical.

Imported by Ray workers by module path (``search_doubles:SleepSimulator``), so
the tests put this folder on PYTHONPATH.
"""

from __future__ import annotations

import dataclasses
import os
import time

from stageopt.errors import SimulatorError
from stageopt.hardware import Hardware
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.base import Estimate, Simulator
from stageopt.workload import Workload

SLEEP_S = float(os.environ.get("STAGEOPT_TEST_SLEEP_S", "0.2"))


class SleepSimulator(Simulator):
    """The analytical estimate after a fixed sleep: a slow backend with known answers."""

    name = "sleep"

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        time.sleep(SLEEP_S)
        probe = os.environ.get("STAGEOPT_TEST_PROBE_DIR")
        if probe:  # which Ray ran this task: a test cluster marks its processes' environment
            with open(os.path.join(probe, f"{os.getpid()}.txt"), "w") as f:
                f.write(os.environ.get("STAGEOPT_TEST_CLUSTER", "local"))
        return AnalyticalSimulator().evaluate(work, hw)


class FlakySimulator(Simulator):
    """Kills its worker process for tp=1 plans and raises for tp=2: crash and error become FAIL trials."""

    name = "flaky"

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        if work.plan.tp == 1:
            os._exit(3)
        if work.plan.tp == 2:
            raise SimulatorError("stand-in simulator refuses tp=2")
        return AnalyticalSimulator().evaluate(work, hw)


class HangSimulator(Simulator):
    """Never returns for pp=1 plans: exercises the timeout."""

    name = "hang"

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        if work.plan.pp == 1:
            time.sleep(3600)
        return AnalyticalSimulator().evaluate(work, hw)


SKEW = 0.6


class SkewedSimulator(Simulator):
    """An expensive backend that disagrees with the analytical model in one known way: tp=8 plans run in
    60% of the analytical time. The plan it likes best ranks low analytically (the confirmation test)."""

    name = "skewed"

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        est = AnalyticalSimulator().evaluate(work, hw)
        if work.plan.tp != 8:
            return est
        t = est.iteration_time_s * SKEW
        return dataclasses.replace(est, backend="skewed", iteration_time_s=t, tokens_per_s=est.tokens_per_s / SKEW,
                                   mfu=est.mfu / SKEW, model_tflops_per_gpu=est.model_tflops_per_gpu / SKEW)


class InlineExecutor:
    """The executor interface of :class:`stageopt.search.executors.RayExecutor`, run in this process.

    For tests of what a search decides (which plans it simulates, what it tells), not of Ray:
    ``poll`` runs every submitted task, in order, and returns its estimate or its error text.
    """

    def __init__(self, simulator: Simulator, workers: int = 2) -> None:
        self.simulator, self.workers = simulator, workers
        self._pending: list[tuple] = []
        self.submitted: list[str] = []  # candidate keys, in the order they were simulated

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, tag, cand, hw: Hardware) -> None:
        self._pending.append((tag, cand, hw))
        self.submitted.append(cand.key)

    def poll(self, wait_all: bool = False) -> list[tuple]:
        from stageopt.workload import build_workload

        done, self._pending = self._pending, []
        out = []
        for tag, cand, hw in done:
            try:
                out.append((tag, self.simulator.evaluate(build_workload(cand.model, cand.plan, cand.gpus), hw)))
            except Exception as err:  # noqa: BLE001 - what RayExecutor reports for a task that raised
                out.append((tag, f"{type(err).__name__}: {err}"))
        return out

    def close(self) -> None:
        self._pending.clear()
