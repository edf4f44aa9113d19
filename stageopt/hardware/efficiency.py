"""How much of a GPU's peak a kernel reaches, as a function of its size.

Why a model and not one constant: a fixed "MFU" fraction makes small kernels
(narrow TP shards, short sequences, small micro-batches) look as fast per FLOP as
big ones, which biases a parallelism search towards over-sharding.

The form used for matmuls and attention is a fixed per-kernel overhead plus a
throughput term::

    time(F)       = overhead_us * 1e-6 + F / (peak_fraction * peak)
    efficiency(F) = F / (time(F) * peak) = peak_fraction * F / (F + F_half)
    F_half        = peak_fraction * peak * overhead_us * 1e-6

i.e. a saturating (Michaelis-Menten) curve in the per-kernel FLOPs ``F``: it tends
to ``peak_fraction`` for large kernels and reaches half of it at ``F_half``.
Stating the parameter as an overhead (launch + prologue/epilogue + tail wave)
rather than as ``F_half`` keeps it portable: a faster GPU needs proportionally
bigger kernels to saturate. Matmuls also pay tile quantization: ``m`` and ``n``
are padded up to a multiple of ``tile`` (a partly filled output tile costs as
much as a full one). Memory-bound ops stream at ``memory_fraction`` of HBM
bandwidth. All parameters are calibration assumptions recorded per preset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stageopt.inputs.schema import bounds, check_fields


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelEfficiency:
    """Overhead-plus-throughput model of one kernel family (see module docstring)."""

    peak_fraction: float = field(metadata=bounds(gt=0, le=1, doc="asymptotic fraction of peak"))
    overhead_us: float = field(metadata=bounds(ge=0, doc="fixed time per kernel launch"))

    def __post_init__(self) -> None:
        check_fields(self)

    def time_s(self, flops: float, peak_tflops: float) -> float:
        """Seconds for one kernel of ``flops`` on a GPU with ``peak_tflops``."""
        if flops <= 0:
            return 0.0
        return self.overhead_us * 1e-6 + flops / (self.peak_fraction * peak_tflops * 1e12)

    def half_saturation_flops(self, peak_tflops: float) -> float:
        """Kernel size (FLOPs) at which efficiency is half of ``peak_fraction``."""
        return self.peak_fraction * peak_tflops * 1e12 * self.overhead_us * 1e-6

    def efficiency(self, flops: float, peak_tflops: float) -> float:
        """Achieved fraction of peak for one kernel of ``flops``."""
        if flops <= 0:
            return 0.0
        return flops / (self.time_s(flops, peak_tflops) * peak_tflops * 1e12)


@dataclass(frozen=True, kw_only=True, slots=True)
class MatmulEfficiency:
    """Kernel efficiency of GEMMs plus tile quantization on the output dimensions."""

    peak_fraction: float = field(metadata=bounds(gt=0, le=1))
    overhead_us: float = field(metadata=bounds(ge=0))
    tile: int = field(default=128, metadata=bounds(ge=1, doc="output tile edge m and n round up to"))

    def __post_init__(self) -> None:
        check_fields(self)

    def padded_flops(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """FLOPs the tensor cores actually execute: m and n rounded up to whole tiles."""
        t = self.tile
        return 2.0 * batch * math.ceil(m / t) * t * math.ceil(n / t) * t * k

    def compute_time_s(self, m: int, n: int, k: int, peak_tflops: float, batch: int = 1) -> float:
        """Seconds for ``batch`` GEMMs (m×k)·(k×n) in one kernel, compute side only."""
        if min(m, n, k, batch) <= 0:
            return 0.0
        throughput = self.peak_fraction * peak_tflops * 1e12
        return self.overhead_us * 1e-6 + self.padded_flops(m, n, k, batch) / throughput

    def efficiency(self, m: int, n: int, k: int, peak_tflops: float, batch: int = 1) -> float:
        """Useful FLOPs (2·m·n·k·batch) per second over peak."""
        useful = 2.0 * batch * m * n * k
        t = self.compute_time_s(m, n, k, peak_tflops, batch)
        return useful / (t * peak_tflops * 1e12) if t > 0 else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuEfficiency:
    """All efficiency parameters of one GPU type."""

    matmul: MatmulEfficiency
    attention_forward: KernelEfficiency
    attention_backward: KernelEfficiency
    memory_fraction: float = field(metadata=bounds(gt=0, le=1, doc="share of HBM bandwidth reached"))

    def __post_init__(self) -> None:
        check_fields(self)
