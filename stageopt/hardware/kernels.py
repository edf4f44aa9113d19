"""How long one kernel takes on a GPU: the one kernel model every backend uses.

Why one place: the analytical model (vectorized over plans), the event replay
(one value per trace node) and the durations written into Chakra traces for
ASTRA-sim must price the same kernel identically, or the backends disagree for
reasons that have nothing to do with what they simulate.

A kernel is described by its kind (:data:`KERNEL_CODES`), its FLOPs, the bytes
it moves through HBM and whether it runs in backward. Matmuls cost the slower
of tensor-core time (a fixed overhead plus FLOPs at the asymptotic fraction of
peak) and HBM time; attention kernels cost their FLOPs at the attention
efficiency (causal ones skip the masked half); vector kernels stream their
bytes through HBM.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware.machine import Hardware

KERNEL_CODES = {"": 0, "matmul": 0, "attention": 1, "attention_causal": 2, "vector": 3}


def kernel_seconds(hw: Hardware, dtype: str, kernel: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
                   backward: np.ndarray) -> np.ndarray:
    """Seconds per kernel; arguments broadcast (e.g. ops x candidate plans).

    ``kernel`` holds :data:`KERNEL_CODES`; ``flops`` counts tensor-core FLOPs
    for matmul/attention kernels; ``nbytes`` is HBM traffic (read + written).
    """
    gpu, eff = hw.gpu, hw.gpu.efficiency
    peak = gpu.peak(dtype) * 1e12
    memory = nbytes / (gpu.hbm_gbps * 1e9 * eff.memory_fraction)
    mm = eff.matmul
    matmul = np.maximum(mm.overhead_us * 1e-6 + flops / (mm.peak_fraction * peak), mm.overhead_us * 1e-6 + memory)
    fwd, bwd = eff.attention_forward, eff.attention_backward
    attn_flops = flops * np.where(kernel == 2, 0.5, 1.0)
    attention = np.where(backward, bwd.overhead_us * 1e-6 + attn_flops / (bwd.peak_fraction * peak),
                         fwd.overhead_us * 1e-6 + attn_flops / (fwd.peak_fraction * peak))
    return np.where(kernel == 3, memory, np.where(kernel == 0, matmul, attention))
