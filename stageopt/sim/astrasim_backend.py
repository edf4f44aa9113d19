"""The ASTRA-sim backend: write the trace set, run the real binary, read its step time.

The binary is named by ``--astra-sim PATH`` or the ``STAGEOPT_ASTRA_SIM``
environment variable; ``network="aware"`` runs the congestion-aware binary
(see :mod:`stageopt.astrasim.runner`), which simulates 1-D networks only, so a
plan spanning more than one scale-up domain is refused before anything is
written. Each run gets its own temporary directory, removed afterwards.

Iteration time is the largest per-rank finish time (1 cycle = 1 ns); memory
comes from the graph, since ASTRA-sim does not model it. A result that breaks
a physical bound (MFU above 100%; a step time of zero or exposed communication
above it are refused by the runner) is an error, never an estimate.
``details`` carries ``known_exit_fault`` (the run ended in ASTRA-sim's known
teardown abort after every rank finished), ``attempts`` and ``notes``: the
by-design differences from ``--backend replay`` that apply to the plan
(:mod:`stageopt.sim.backend_notes`), plus the exit-fault flag in words.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from stageopt.astrasim.config_writer import network_dims
from stageopt.astrasim.output import AstraSimOutputError
from stageopt.astrasim.runner import DEFAULT_TIMEOUT_S, NETWORKS, find_astra_sim, require_one_dimension, run_astra_sim
from stageopt.errors import ConfigError
from stageopt.hardware import Hardware
from stageopt.program.generate import GROUPS_NAME, generate
from stageopt.sim.backend_notes import astra_sim_notes
from stageopt.sim.base import Estimate, Simulator, estimate_from_times
from stageopt.workload import Workload

EXIT_FAULT_NOTE = ("ASTRA-sim crashed at exit (its known teardown fault, exit 134 or a segfault) after every rank "
                   "had finished; the numbers are complete{retry}")


class AstraSimSimulator(Simulator):
    """Runs ASTRA-sim's analytical backend (congestion-unaware or -aware) on the generated Chakra traces."""

    name = "astra-sim"

    def __init__(self, binary: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 network: str = "unaware") -> None:
        if network not in NETWORKS:
            raise ConfigError(f"--astra-sim-network {network!r} is unknown; use one of {', '.join(NETWORKS)}")
        self.binary = binary
        self.timeout_s = timeout_s
        self.network = network

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        dims = len(network_dims(hw, work.plan.gpus))
        if self.network == "aware":
            require_one_dimension(dims, f"the network of {work.plan.gpus} GPUs on {hw.name} "
                                        f"({hw.node.gpus} per scale-up domain)")
        find_astra_sim(self.binary, self.network)  # a missing binary fails before traces are written
        with tempfile.TemporaryDirectory(prefix="stageopt-astra-") as tmp:
            out = Path(tmp) / "traces"
            written = generate(work, hw, out)
            result = run_astra_sim(workload=out / "workload", system=out / "system.json",
                                   network=out / "network.yml", memory=out / "memory.json",
                                   comm_groups=out / GROUPS_NAME, n_ranks=work.plan.gpus, binary=self.binary,
                                   timeout_s=self.timeout_s, workdir=Path(tmp) / "run", network_model=self.network)
        slowest = max(range(len(result.per_rank_cycles)), key=lambda r: result.per_rank_cycles[r])
        notes = astra_sim_notes(written.programs, work.plan, written.system or {}, dims, self.network,
                                hw.nccl is not None)
        if result.known_exit_fault:
            retry = f" (run {result.attempts} times)" if result.attempts > 1 else ""
            notes.insert(0, EXIT_FAULT_NOTE.format(retry=retry))
        flushes = work.plan.flushes  # the traces hold one pipeline flush; a step runs them back to back
        if flushes > 1:
            notes.append(f"the traces hold one of the step's {flushes} pipeline flushes; the step is {flushes} "
                         "back-to-back runs of them")
        est = estimate_from_times(work, hw, self.name, flushes * result.max_cycles * 1e-9,
                                  flushes * result.per_rank_exposed_comm[slowest] * 1e-9,
                                  {"network": self.network, "known_exit_fault": result.known_exit_fault,
                                   "attempts": result.attempts, "notes": notes})
        if est.mfu > 1.0:
            raise AstraSimOutputError(f"ASTRA-sim's step time of {est.iteration_time_s:.6g} s means MFU "
                                      f"{est.mfu:.1%}, above the GPU's peak; refusing a result that breaks a "
                                      f"physical bound (check the binary and the traces' duration_micros)")
        return est
