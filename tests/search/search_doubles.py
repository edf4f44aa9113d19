"""Stand-in simulators for the executor tests: slow, crashing or raising, otherwise analytical.

Imported by Ray workers by module path (``search_doubles:SleepSimulator``), so
the tests put this folder on PYTHONPATH.
"""

from __future__ import annotations

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
