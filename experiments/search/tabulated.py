"""The event replay, served from the table ``replay_table.py`` wrote (replay is deterministic).

Used as ``--backend tabulated:TabulatedReplay`` with ``experiments/search`` on PYTHONPATH and
``STAGEOPT_REPLAY_TABLE`` naming the table: the search path (census, confirmation, budget
accounting, Ray workers, trials) is the real one; only a plan's repeat simulation is looked up.
A plan missing from the table is replayed for real.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

from stageopt.hardware import Hardware
from stageopt.sim.base import Estimate, Simulator, estimate_from_times
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import Workload


@lru_cache(maxsize=4)
def _table(path: str) -> dict[str, float]:
    return json.loads(open(path).read())["iteration_time_s"]


class TabulatedReplay(Simulator):
    name = "replay"

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        key = f"{hw.name} | gpus={work.plan.gpus} | seq={work.model.seq} | {work.plan}"
        table = _table(os.environ["STAGEOPT_REPLAY_TABLE"])
        if key not in table:
            return ReplaySimulator().evaluate(work, hw)
        return estimate_from_times(work, hw, "replay", table[key], 0.0, {"tabulated": True})
