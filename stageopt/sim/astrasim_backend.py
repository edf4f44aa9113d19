"""The ASTRA-sim backend: write the trace set, run the real binary, read its step time.

The binary is named by ``--astra-sim PATH`` or the ``STAGEOPT_ASTRA_SIM``
environment variable (see :mod:`stageopt.astrasim.runner`). Each run gets
its own temporary directory, removed afterwards. Iteration time is the largest
per-rank finish time (1 cycle = 1 ns); memory comes from the graph, since
ASTRA-sim does not model it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from stageopt.astrasim.runner import DEFAULT_TIMEOUT_S, run_astra_sim
from stageopt.hardware import Hardware
from stageopt.program.generate import GROUPS_NAME, generate
from stageopt.sim.base import Estimate, Simulator, estimate_from_times
from stageopt.workload import Workload


class AstraSimSimulator(Simulator):
    """Runs ASTRA-sim's analytical backend on the generated Chakra traces."""

    name = "astra-sim"

    def __init__(self, binary: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.binary = binary
        self.timeout_s = timeout_s

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        with tempfile.TemporaryDirectory(prefix="stageopt-astra-") as tmp:
            out = Path(tmp) / "traces"
            generate(work, hw, out)
            result = run_astra_sim(workload=out / "workload", system=out / "system.json",
                                   network=out / "network.yml", memory=out / "memory.json",
                                   comm_groups=out / GROUPS_NAME, n_ranks=work.plan.gpus,
                                   binary=self.binary, timeout_s=self.timeout_s, workdir=Path(tmp) / "run")
        slowest = max(range(len(result.per_rank_cycles)), key=lambda r: result.per_rank_cycles[r])
        return estimate_from_times(work, hw, self.name, result.max_cycles * 1e-9,
                                   result.per_rank_exposed_comm[slowest] * 1e-9,
                                   {"known_exit_fault": result.known_exit_fault})
