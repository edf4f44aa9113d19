"""The simulator interface: one small contract every backend honours.

A :class:`Simulator` turns a workload (model + plan, see
:func:`stageopt.workload.build_workload`) and a :class:`~stageopt.hardware.Hardware`
into a frozen :class:`Estimate`. Backends: ``AnalyticalSimulator`` (closed
form, vectorized), the event replay, and the real ASTRA-sim binary.

Contract (checked by ``tests/sim/contract.py`` for every backend):
tp=1 means no TP traffic; more bandwidth is never slower; results are
deterministic and pickle; doubling GPUs at a fixed global batch never raises
per-GPU work.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from stageopt.hardware import Hardware
from stageopt.workload import Workload
from stageopt.workload.stats import all_stage_stats


@dataclass(frozen=True)
class Estimate:
    """What one simulation says about one training iteration."""

    backend: str
    iteration_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float  # model FLOPs (no recompute) per GPU per second / 1e12
    hardware_tflops_per_gpu: float  # including recompute
    mfu: float
    peak_memory_gib: float
    memory_breakdown_gib: dict[str, float]
    time_breakdown_s: dict[str, float]
    fits_memory: bool
    details: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_gib,
            "memory_breakdown_gib": self.memory_breakdown_gib,
            "time_breakdown_s": self.time_breakdown_s,
            "fits_memory": self.fits_memory,
            **({"details": self.details} if self.details else {}),
        }


class Simulator(abc.ABC):
    """Base class of the backends; subclasses set ``name`` and implement ``evaluate``."""

    name: str = "base"

    @abc.abstractmethod
    def evaluate(self, work: Workload, hw: Hardware) -> Estimate:
        """Estimate one iteration of ``work`` on ``hw``."""


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
