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
