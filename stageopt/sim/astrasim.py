"""The ASTRA-sim backend: write the trace set, run the real binary, read its step time.

The binary is named by ``--astra-sim PATH`` or the ``STAGEOPT_ASTRA_SIM``
environment variable (see :mod:`stageopt.sim.astrasim_runner`). Each run gets
its own temporary directory, removed afterwards. Iteration time is the largest
per-rank finish time (1 cycle = 1 ns); memory comes from the graph, since
ASTRA-sim does not model it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from stageopt.hardware import Hardware
from stageopt.program.generate import GROUPS_NAME, generate
from stageopt.sim.astrasim_runner import DEFAULT_TIMEOUT_S, run_astra_sim
from stageopt.sim.base import Estimate, Simulator
from stageopt.stage_stats import all_stage_stats
from stageopt.workload import Workload


def estimate_from_times(work: Workload, hw: Hardware, backend: str, iteration_s: float,
                        exposed_comm_s: float, details: dict | None = None) -> Estimate:
    """An Estimate from a measured iteration time, with FLOP rates and memory from the graph."""
    plan = work.plan
    stats = all_stage_stats(work)
    ranks = plan.dp * plan.tp * plan.cp
    model_flops = sum(s.flops["fwd"] + s.flops["bwd"] for s in stats) * ranks
    hardware_flops = model_flops + sum(s.flops["recompute"] for s in stats) * ranks
    memory = max((s.memory for s in stats), key=lambda m: m.total)
    gib = memory.gib()
    total = gib.pop("total")
    model_tflops = model_flops / (iteration_s * plan.gpus) / 1e12
    return Estimate(
        backend=backend, iteration_time_s=iteration_s,
        tokens_per_s=plan.gbs * work.model.seq / iteration_s,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hardware_flops / (iteration_s * plan.gpus) / 1e12,
        mfu=model_tflops / hw.gpu.peak(plan.dtype),
        peak_memory_gib=total, memory_breakdown_gib=gib,
        time_breakdown_s={"compute": iteration_s - exposed_comm_s, "exposed_comm": exposed_comm_s},
        fits_memory=total <= hw.gpu.hbm_gib, details=details or {})


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
