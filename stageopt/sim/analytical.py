"""The analytical backend: closed-form estimate of one plan (or many at once).

``AnalyticalSimulator.evaluate`` is the one-plan view of
:func:`stageopt.sim.analytical_batch.evaluate_plans`; the search calls the
batch function directly.
"""

from __future__ import annotations

from stageopt.hardware import Hardware
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.sim.base import Estimate, Simulator
from stageopt.workload import Workload

MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "other")


def estimate_from_row(result: dict, i: int, hw: Hardware, backend: str = "analytical") -> Estimate:
    """Build the Estimate of candidate ``i`` from batch result arrays."""
    memory = {k: float(result[f"mem_{k}"][i]) for k in MEMORY_KEYS}
    peak = float(result["mem_total"][i])
    times = {
        "compute": float(result["t_compute"][i]),
        "exposed_tp_comm": float(result["t_tp"][i]),
        "exposed_cp_comm": float(result["t_cp"][i]),
        "exposed_ep_comm": float(result["t_ep"][i]),
        "pipeline_p2p": float(result["t_p2p"][i]),
        "pipeline_bubble": float(result["t_bubble"][i]),
        "exposed_dp_comm": float(result["t_dp"][i]),
        "optimizer": float(result["t_optimizer"][i]),
        "activation_offload": float(result["t_offload"][i]),
    }
    times["exposed_comm"] = (times["exposed_tp_comm"] + times["exposed_cp_comm"] + times["exposed_ep_comm"]
                             + times["exposed_dp_comm"] + times["pipeline_p2p"])
    return Estimate(
        backend=backend,
        iteration_time_s=float(result["iteration_time_s"][i]),
        tokens_per_s=float(result["tokens_per_s"][i]),
        model_tflops_per_gpu=float(result["model_tflops_per_gpu"][i]),
        hardware_tflops_per_gpu=float(result["hardware_tflops_per_gpu"][i]),
        mfu=float(result["mfu"][i]),
        peak_memory_gib=peak,
        memory_breakdown_gib=memory,
        time_breakdown_s=times,
        fits_memory=peak <= hw.gpu.hbm_gib,
    )


class AnalyticalSimulator(Simulator):
    """Closed-form model compiled from the graph; microseconds per plan in batches."""

    name = "analytical"

    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        result = evaluate_plans(work.model, hw, [work.plan])
        return estimate_from_row(result, 0, hw)
