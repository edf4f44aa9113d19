"""How close a kernel gets to the GPU's peak: the physical parameters of the kernel model.

Why physical parameters and not one fitted "efficiency": a fitted constant
absorbs whatever the model leaves out (unfused elementwise kernels, launch
gaps) and then bends every answer that changes the amount of such work (tp,
sp, recompute, micro-batch size). Each parameter here is something a
microbenchmark measures, with a physical range enforced on it:

* ``memory_fraction``: the share of the HBM bandwidth a streaming kernel reaches
  (a device-to-device copy or STREAM triad reaches ~0.90 on H100);
* ``random_fraction``: the share of that copy rate an elementwise kernel reaches when it draws
  a random number per element (dropout's Philox generator costs SM work the copy does not):
  PyTorch's dropout measures 0.80 of the copy rate on H100 and 0.65 on H200, whose faster HBM
  the same SMs feed (experiments/kernels/); 1 where no one has measured it;
* ``matmul.peak_fraction`` (and ``fp8_peak_fraction``): the share of peak a large
  cuBLAS GEMM reaches per output tile, at the clocks a GPU holds under load;
* ``tile_m`` x ``tile_n``: the output tile one streaming multiprocessor computes;
  a GEMM runs in *waves* of ``sm_count`` tiles, and a partly filled tile or wave
  costs as much as a full one (tile and wave quantization; split-K spreads the
  last, partial wave over all SMs). cuBLAS picks its tile per shape, so a GEMM
  costs the cheapest of ``tile_m x tile_n``, its transpose and the square
  ``small_tile`` at ``small_tile_share`` of the large tile's rate (it reuses each
  operand load less). Measured on one H200 (experiments/kernels/): over 441
  training-shaped GEMMs the one fixed 128x256 tile misprices shapes by up to 68%,
  the choice among three by at most 14%, with the output store below;
* ``attention_*.peak_fraction``: the share of peak the best fused attention
  kernel (today's cuDNN / FlashAttention-3 class) reaches, forward and backward
  (a stack on 2024's cuDNN reaches :data:`CUDNN_2024_SHARE` of it: cuDNN's own benchmark, same GPU and clocks);
  ``attention_*.fa2_peak_fraction`` what FlashAttention-2 (PyTorch SDPA's flash
  backend) reaches, measured where a GPU's kernels were timed
  (experiments/kernels/), else ``fa2_attention_scale`` times the best share;
* ``attention_tile``: the query (and key) block a fused attention kernel computes at once.
  A causal or sliding-window mask skips the blocks wholly outside it but computes the
  blocks it cuts across in full (FlashAttention-2, Dao 2023, sec. 3.1.1: masking is
  applied only to the blocks on the diagonal), so each query row pays about half a
  block of keys more than it keeps at every mask edge: with ``n = S / T`` blocks of
  ``T`` a side, causal attention over ``S`` keys computes ``n (n + 1) / 2`` blocks,
  ``1 + T / S`` times its unmasked half. FlashAttention-3 and cuDNN's fused attention
  run 128 x 128 blocks at head dim 128 on Hopper (FlashAttention-2 128 x 64 forward on
  Ampere: the larger side sets the waste);
* ``attention_*.tile_us``: what one tile of a fused attention kernel (``attention_tile`` query rows
  forward, as many key rows backward) costs its SM beyond its blocks of scores: loading the tile and
  filling the pipeline before the loop over the other operand, normalizing and storing the result after
  it. A kernel of ``t`` tiles pays ``t x tile_us / sm_count`` on top of its FLOPs, so short key loops
  (short sequences, sliding windows, ring context parallelism's one chunk per call) run further below
  peak. Fitted to cuDNN's own SDPA benchmark together with the share of peak
  (``experiments/kernels/attention_tiles.py``: one share and one tile cost per pass reproduce every
  sequence length, head dim 64 to 256, causal, unmasked and windowed, where a share alone misses by 14-20%);
  0 where no such benchmark was run;
* ``exp_overlap``: the share of the softmax exponentials (``gpu.exp_tops``) the best attention
  kernel runs while its tensor cores work, so that a kernel costs
  ``matmuls + exps - exp_overlap x min(matmuls, exps)``. FlashAttention-3 on Hopper pipelines one
  block's softmax under the next block's two GEMMs and ping-pongs two warpgroups (Shah et al. 2024:
  removing either drops BF16 forward from 661 to 582 / 570 TFLOP/s); FlashAttention-4 and cuDNN do
  the same on Blackwell, where FA4 reaches 1,605 TFLOP/s (71% of 2,250), more than a B200 can
  reach with its MUFU exponentials taken in turn with full-rate matmuls (1,285): 1 on Hopper and
  Blackwell. FlashAttention-2 (Ampere's design, and the ``fa2`` kernel on any GPU) waits for them: 0;
* ``launch_us``: the fixed cost of one kernel on the GPU (launch gap, prologue);
* a GEMM's *output store* is not hidden behind its main loop: each output tile
  is written after its last k-step, at the SM's share of HBM bandwidth (on H200
  that store takes as long as ~130 k-steps of a 128x256 BF16 tile; fitting a
  free per-tile cost to the same measurements gives 160-180, and with it the
  same error);
* ``host_us``: the CPU time a training framework spends to dispatch one kernel; a
  kernel shorter than that leaves the GPU waiting for the next one;
* ``graph_launch_us``: the gap between kernels replayed from a CUDA graph (serving
  engines replay decode steps so), which pays neither the launch nor the host cost;
* ``a2a_overlap_saving``: of each second an expert all-to-all runs under compute
  (``ep_overlap``), the share the step saves. The dispatch and combine kernels
  (DeepEP, HybridEP, NCCL) move data with SMs and HBM traffic that the GEMMs
  they overlap also need. Megatron-Bridge's A/B profile of Qwen3-30B-A3B on
  16 H100 (EP16, HybridEP) found 3.959 s of communication concurrent with
  GEMMs and attention, while the GPU's busy time fell by only 1.600 s: 0.40;
* ``overlap_slowdown``: how much longer compute takes while a data-parallel
  collective (gradient reduction, ZeRO-3/FSDP gathers and scatters) runs beside
  it on its own stream: NCCL's kernels hold SMs and HBM bandwidth the GEMMs
  need. Lee et al., "Characterizing Compute-Communication Overlap in
  GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114, 2025) measure
  18.9% on average (40.0% at most) over GPT and LLaMA training steps on A100,
  H100, MI250 and MI210; kernels progress at ``1 / (1 + overlap_slowdown)``
  while such a collective is in flight;
* ``speed_spread``: the standard deviation of compute speed across GPUs of one
  model in one cluster, as a share of the mean. Identical GPUs run at different
  clocks under the same power cap (manufacturing variation and power
  management): Sinha et al., "Not All GPUs Are Created Equal" (SC22, arXiv
  2208.11035) measure 8% average performance variation across the GPUs of a
  cluster on compute-bound kernels; read as the range over a cluster of a few
  thousand GPUs (about 7 standard deviations of a normal spread) that is a
  standard deviation of ~1.1%, and the default is 0.01. A training step
  synchronizes every GPU (the TP collectives every layer, the pipeline sends,
  the gradient sync every step), and a slow GPU stays slow, so the step runs at
  the pace of the slowest of its ``n`` GPUs: the SM-clock-bound work (GEMMs,
  attention) takes
  ``1 + speed_spread * E[max of n standard normals]`` times its time on a
  typical GPU (:func:`slowest_gpu_slowdown`); HBM-bound kernels keep their rate.

The time formulas that combine them live in :mod:`stageopt.hardware.kernels`
(vectorized, shared by every backend); this module holds the parameters and the
per-kernel closed forms they enter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtri

from stageopt.frameworks.profile import LOW_PRECISION_RECIPES
from stageopt.inputs.schema import bounds, check_fields


# A flash-attention backward kernel recomputes the score matrix before its four
# gradient matmuls: five matmuls to the forward's two, 2.5x the forward's FLOPs,
# where model FLOPs (and MFU) count 2x. Attention throughputs are published in
# the kernel's own count (FlashAttention's benchmarks/benchmark_flash_attention.py:
# bwd = 2.5 x fwd), so the backward share of peak applies to these executed FLOPs.
FLASH_BACKWARD_EXECUTED_FLOPS = 2.5 / 2.0


# cuDNN's own SDPA benchmark on one H200 (BF16, causal, head dim 128, 4K-32K tokens, clocks locked at 1,980 MHz), run
# by NVIDIA/cudnn-frontend at two dates: cuDNN 9.1.0 (benchmark/benchmark_results.csv @b740542, 2024-05; 16 heads)
# against cuDNN 9.19.1 (benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn @df73764, 2026-02; 64 query
# heads, 8 KV heads). The 2024 kernel reaches 0.880 of today's forward rate and 0.878 of its backward, on average
# over the four lengths (0.92-0.84 and 0.94-0.86; experiments/kernels/cudnn_sdpa_h200.csv): the ``cudnn-2024``
# attention of the stacks of that year.
CUDNN_2024_SHARE = 0.88


# PyTorch's FlexAttention (a Triton kernel torch.compile generates from a score/mask function) against the best
# kernel of its GPU's generation, (forward, backward) throughput: on A100 it reaches 0.90 / 0.85 of FlashAttention-2
# (PyTorch blog "FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention", 2024-08), on
# H100 0.85 / 0.76 of FlashAttention-3 on average (Guessous, GTC 2025 session "FlexAttention: The Flexibility of
# PyTorch With the Performance of FlashAttention", as the PyTorch blog's GTC 2025 listing quotes it; ~25% / ~3%
# faster than FlashAttention-2 there). Keyed by the design of the GPU's best kernel: one that waits for its
# exponentials (FlashAttention-2 class: Ampere) or one that hides them (FlashAttention-3 / cuDNN class: Hopper
# and later, where Blackwell takes Hopper's ratio, unmeasured).
FLEX_SHARE = {"fa2-class": (0.90, 0.85), "fa3-class": (0.85, 0.76)}


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelEfficiency:
    """Asymptotic share of peak of one fused kernel family (flash attention forward or backward).

    ``fa2_peak_fraction`` is FlashAttention-2's own share, measured (PyTorch SDPA's flash backend): a
    different kernel from the best one, whose share the published runs fit, so it is not tied to it.
    """

    peak_fraction: float = field(metadata=bounds(gt=0.2, le=0.95, doc="asymptotic fraction of peak"))
    fa2_peak_fraction: float | None = field(default=None, metadata=bounds(
        gt=0.05, le=0.95, doc="FlashAttention-2's fraction of peak (null: fa2_attention_scale x peak_fraction)"))
    tile_us: float = field(default=0.0, metadata=bounds(
        ge=0, le=50, doc="fixed cost of one attention tile (query tile forward, key tile backward), on one SM"))

    def __post_init__(self) -> None:
        check_fields(self)

    def fraction(self, kernel: str, fa2_scale: float) -> float:
        """Share of peak of the stack's attention ``kernel`` (best | cudnn-2024 | fa2): ``peak_fraction`` is
        today's best kernel; cuDNN's 2024 release reaches :data:`CUDNN_2024_SHARE` of it."""
        if kernel == "cudnn-2024":
            return CUDNN_2024_SHARE * self.peak_fraction
        if kernel != "fa2":
            return self.peak_fraction
        return self.fa2_peak_fraction if self.fa2_peak_fraction is not None else fa2_scale * self.peak_fraction


@dataclass(frozen=True, kw_only=True, slots=True)
class MatmulEfficiency:
    """GEMMs: share of peak per full tile, and the tile the wave quantization counts in."""

    peak_fraction: float = field(metadata=bounds(gt=0.4, le=0.95, doc="bf16/fp16 share of peak per full tile"))
    fp8_peak_fraction: float | None = field(default=None, metadata=bounds(
        gt=0.3, le=0.95, doc="fp8 share of fp8 peak per full tile (null: the GPU has no fp8 tensor cores)"))
    fp4_peak_fraction: float | None = field(default=None, metadata=bounds(
        gt=0.3, le=0.95, doc="NVFP4 share of FP4 peak per full tile (null: as fp8_peak_fraction)"))
    tile_m: int = field(default=128, metadata=bounds(ge=16, doc="output tile rows"))
    tile_n: int = field(default=256, metadata=bounds(ge=16, doc="output tile columns"))
    small_tile: int = field(default=128, metadata=bounds(ge=16, doc="side of the square fallback tile"))
    # experiments/kernels/ (one H200, 441 BF16 GEMMs): 0.928 BF16, 0.950 FP8
    small_tile_share: float = field(default=0.93, metadata=bounds(
        gt=0.5, le=1.0, doc="rate of the square fallback tile relative to the large one"))

    def __post_init__(self) -> None:
        check_fields(self)

    def tile_choices(self) -> tuple[tuple[int, int, float], ...]:
        """(rows, columns, share of the full-tile rate) of each tile cuBLAS may pick."""
        large = (self.tile_m, self.tile_n, 1.0)
        return large, (self.tile_n, self.tile_m, 1.0), (self.small_tile, self.small_tile, self.small_tile_share)

    def fraction(self, dtype: str) -> float:
        """Share of its peak per full tile of a GEMM running in ``dtype``.

        NVFP4 falls back to the FP8 share where no FP4 figure is set: Blackwell's FP4 MMA doubles the FP8
        rate through the same tiles and pipeline, so the share of each peak is the same to first order.
        """
        if dtype == "nvfp4" and self.fp4_peak_fraction is not None:
            return self.fp4_peak_fraction
        if dtype in LOW_PRECISION_RECIPES and self.fp8_peak_fraction is not None:
            return self.fp8_peak_fraction
        return self.peak_fraction


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuEfficiency:
    """All kernel-model parameters of one GPU type (see the module docstring)."""

    matmul: MatmulEfficiency
    attention_forward: KernelEfficiency
    attention_backward: KernelEfficiency
    memory_fraction: float = field(metadata=bounds(gt=0.5, le=1, doc="share of HBM bandwidth a copy reaches"))
    random_fraction: float = field(default=1.0, metadata=bounds(
        ge=0.3, le=1, doc="share of the copy rate a kernel drawing a random number per element reaches (dropout)"))
    launch_us: float = field(metadata=bounds(ge=0.5, le=20, doc="fixed cost of one kernel"))
    host_us: float = field(default=0.0, metadata=bounds(ge=0, le=50, doc="host time to dispatch one kernel"))
    graph_launch_us: float = field(default=1.5, metadata=bounds(
        ge=0.2, le=10, doc="gap between kernels replayed from a CUDA graph"))
    fa2_attention_scale: float = field(default=1.0, metadata=bounds(
        gt=0.2, le=1.0, doc="FlashAttention-2 throughput relative to the best attention kernel"))
    exp_overlap: float = field(default=0.0, metadata=bounds(
        ge=0, le=1.0, doc="share of the softmax exponentials the best attention kernel hides under its matmuls"))
    # FlashAttention-3 (Shah et al. 2024) / cuDNN: 128 x 128 blocks at head dim 128 on Hopper and Blackwell
    attention_tile: float = field(default=128.0, metadata=bounds(
        ge=16, le=512, doc="query/key block of a fused attention kernel: masked-edge blocks are computed whole"))
    # Megatron-Bridge skills/nemo-mbridge-perf-expert-parallel-overlap (2026-07-25 profile): 1.600 s / 3.959 s
    a2a_overlap_saving: float = field(default=0.40, metadata=bounds(
        gt=0, le=1.0, doc="share of an expert all-to-all's overlapped time that the step saves"))
    # Lee et al. 2025 (arXiv 2507.03114): compute overlapped with communication slows 18.9% on average, 40.0% at most
    overlap_slowdown: float = field(default=0.189, metadata=bounds(
        ge=0, le=0.40, doc="how much longer compute takes beside a data-parallel collective"))
    # Sinha et al. SC22 (arXiv 2208.11035): 8% average performance variation across one cluster's GPUs
    speed_spread: float = field(default=0.01, metadata=bounds(
        ge=0, le=0.05, doc="standard deviation of GPU compute speed across a cluster, share of the mean"))

    def __post_init__(self) -> None:
        check_fields(self)

    def exps_hidden(self, attention_kernel: str) -> float:
        """Share of the softmax exponentials the stack's attention kernel (best | cudnn-2024 | fa2) runs under its
        matmuls."""
        return 0.0 if attention_kernel == "fa2" else self.exp_overlap

    def flex_share(self, backward: bool) -> float:
        """FlexAttention's throughput relative to this GPU's best attention kernel (:data:`FLEX_SHARE`)."""
        forward_share, backward_share = FLEX_SHARE["fa3-class" if self.exp_overlap > 0 else "fa2-class"]
        return backward_share if backward else forward_share

    @property
    def overlapped_rate(self) -> float:
        """Progress rate of a kernel that runs beside a data-parallel collective (1: no contention)."""
        return 1.0 / (1.0 + self.overlap_slowdown)

    def slowest_gpu_slowdown(self, gpus):
        """How much longer SM-bound work takes on the slowest of ``gpus`` GPUs in lockstep than on a typical
        one: ``1 + speed_spread * E[max of gpus standard normals]`` (Blom's approximation of the expected
        maximum: 4.5% high for two GPUs, within 1% from eight up; 1 for a single GPU). Broadcasts."""
        n = np.maximum(np.asarray(gpus, dtype=float), 1.0)
        return 1.0 + self.speed_spread * ndtri((n - 0.375) / (n + 0.25))


def gemm_padded_flops(m, n, k, batch, tile_m: int, tile_n: int, sm_count: int):
    """FLOPs the tensor cores spend on a (batched) GEMM, counting whole tiles and whole waves.

    ``m x n`` outputs (per batch entry) are cut into ``tile_m x tile_n`` tiles;
    all ``batch`` entries' tiles are spread over ``sm_count`` SMs in waves; every
    tile of every wave costs ``2 * tile_m * tile_n * k``. The last, partly filled
    wave splits ``k`` so that its tiles fill the SMs (split-K / stream-K, as
    cuBLAS does for skinny GEMMs and wave tails). Arguments broadcast.
    """
    m, n, k, batch = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
    tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n) * batch
    full = np.floor(tiles / sm_count)
    rest = tiles - full * sm_count
    splits = np.maximum(np.floor(sm_count / np.maximum(rest, 1)), 1)
    tail = np.where(rest > 0, sm_count * np.ceil(k / splits), 0.0)
    return 2.0 * tile_m * tile_n * (full * sm_count * k + tail)


def gemm_tiled_flops(m, n, k, batch, matmul: MatmulEfficiency, sm_count: int):
    """FLOPs at the large tile's rate that a GEMM costs in the cheapest of
    :meth:`MatmulEfficiency.tile_choices` (a smaller tile's FLOPs count at its lower rate)."""
    costs = [gemm_padded_flops(m, n, k, batch, rows, cols, sm_count) / share
             for rows, cols, share in matmul.tile_choices()]
    return np.minimum.reduce(costs)
