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
