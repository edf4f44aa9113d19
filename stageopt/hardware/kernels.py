"""How long one kernel takes on a GPU: the one kernel model every backend uses.

Why one place: the analytical model (vectorized over plans), the event replay
(one value per trace node) and the durations written into Chakra traces for
ASTRA-sim must price the same kernel identically, or the backends disagree for
reasons that have nothing to do with what they simulate.

A kernel is described by :class:`Kernels` (arrays, one entry per kernel, that
broadcast against candidate plans): its family (:data:`KERNEL_CODES`), its
FLOPs, the bytes it moves through HBM, its GEMM shape, its precision class and
whether it runs in backward. Every kernel pays ``launch_us``; then

* a **matmul** costs the slower of its tensor-core main loop (whole tiles in
  whole waves over the SMs, the cheapest tile cuBLAS may pick:
  :func:`~stageopt.hardware.efficiency.gemm_tiled_flops`, at the GEMM share of
  peak) and the reads of its operands, then the store of its output, which no
  main loop hides (the output tile is written after its last k-step); a grouped
  expert GEMM that a stack runs as one GEMM per expert (``count`` > 1) pays a
  launch per :data:`GEMM_STREAMS` of them, whose fixed costs overlap;
* an **attention** kernel costs its FLOPs at the flash-attention share of peak
  (causal kernels skip the masked half; a backward kernel executes 1.25x its
  model FLOPs, as it recomputes the scores), then one exponential per score on
  the special-function units (``gpu.exp_tops``), which a FlashAttention-2 class
  kernel waits for between its two matmuls and a Hopper or Blackwell kernel runs
  under them (``exp_overlap``); its ``k`` carries its FLOPs per score (4 x head dim
  forward), so a kernel's scores are ``flops / k``; and each of its tiles (128 query
  rows forward, 128 key rows backward) costs its SM ``tile_us`` more, before and after
  its loop over the other operand, which short key loops feel most;
* a **vector** kernel streams its bytes at the achievable HBM bandwidth; one that
  draws a random number per element (``vector_random``: dropout) at the share of
  it ``random_fraction`` says.

GEMMs and attention run at the SM clock of the slowest of the ``gpus`` GPUs a
step keeps in lockstep (``speed_spread``,
:meth:`~stageopt.hardware.efficiency.GpuEfficiency.slowest_gpu_slowdown`); HBM
streams and fixed costs do not depend on it.

No kernel takes less than ``host_us``, the time the framework's host thread needs
to dispatch it: a run of tiny kernels is bound by the CPU, not the GPU.

Precision: with ``dtype=fp8`` (or ``nvfp4``) only the linear layers' GEMMs run
in FP8 (FP4) (the Transformer Engine recipes); attention, the router, the output
layer and all elementwise work stay in BF16. A low-precision forward or
data-gradient GEMM first casts its activation operand (read BF16, write the
row-wise and the column-wise low-precision copies: 2 + 2 x 1 bytes an element
for FP8, 2 + 2 x 0.5625 for NVFP4 with its block scales), priced as extra
memory-bound kernels. NVFP4 GEMMs run at the FP4 peak. How FP8 casts depends on
the recipe (:data:`FP8_CASTS`): delayed scaling casts in one pass, current
(tensorwise) scaling reads the input once more for its amax first, and a grouped
expert GEMM casts its experts one by one except under delayed scaling.

Gradient accumulation: where the stack fuses it into the weight-gradient GEMM
(``wgrad_store_bytes``), that GEMM's epilogue reads the main-gradient buffer
and writes it back, so its store moves those bytes an element, not one BF16
write. A weight-gradient GEMM is a backward GEMM of the ``LOWP`` class: the
linear layers' (the output layer and the router, kept in BF16, are left out;
their epilogue is a few percent of their own GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stageopt.frameworks.profile import LOW_PRECISION_RECIPES
from stageopt.hardware.efficiency import FLASH_BACKWARD_EXECUTED_FLOPS, gemm_tiled_flops
from stageopt.hardware.machine import DTYPE_BYTES, Hardware

KERNEL_CODES = {"": 0, "matmul": 0, "attention": 1, "attention_causal": 2, "vector": 3, "vector_random": 4}

# Precision classes of a kernel (set by the graph): stays high precision; FP8-capable
# GEMM that casts its activation operand first; FP8-capable GEMM whose operands were
# cast already (weight gradient: it reuses the transposed copies made for the others).
HIGH, LOWP_CAST, LOWP = 0, 1, 2

# Transformer Engine's grouped GEMM (GroupedLinear, the experts of Megatron-Core's TEGroupedMLP) launches one
# cuBLAS GEMM per expert, round-robin over its compute streams, of which it keeps 4 (multi_stream_cublas_gemm,
# transformer_engine/common/gemm/cublaslt_gemm.cu; get_num_compute_streams, common/util/multi_stream.cpp,
# since TE 1.9, NVIDIA/TransformerEngine#853). A kernel's ``count`` > 1 on a GEMM says how many it launches.
GEMM_STREAMS = 4
# Its userbuffer overlap (TP communication pipelined with the GEMM) runs the chunks of a GEMM on up to 3 compute
# streams (_NUM_MAX_UB_STREAMS, transformer_engine/pytorch/cpp_extensions/gemm.py; CommOverlapCore::initialize).
UB_STREAMS = 3

# What casting one FP8 GEMM operand costs under each scaling recipe (Megatron-Core's --fp8-recipe names):
# (bytes an element read beyond the cast's own, kernels, one cast per expert of a grouped GEMM, a gathered
# operand's column-wise copy made after the gather). A cast reads BF16 (2 bytes) and writes a row-wise and a
# column-wise copy (1 + 1). An operand all-gathered over TP (sequence parallelism) is cast on each rank's shard
# and gathered in FP8; Transformer Engine "cannot directly all-gather the transposed FP8 tensor", so per-tensor
# recipes cast the shard row-wise only and transpose the gathered tensor (read 1, write 1, one more kernel:
# _all_gather_fp8, transformer_engine/pytorch/distributed.py), while block-scaled copies gather both directions.
# delayed: one cast-transpose kernel takes the amax in the same pass; a grouped GEMM's experts are cast by one
#   multi-tensor kernel (Transformer Engine's nvte_multi_cast_transpose, which it has "only for FP8 delayed
#   scaling": multi_tensor_quantize_impl, transformer_engine/pytorch/csrc/extensions/cast.cpp).
# tensorwise (current scaling): an amax kernel reads the input, a kernel turns the amax into the scale, then the
#   cast (Float8CurrentScalingQuantizer::quantize_impl, transformer_engine/pytorch/csrc/quantizer.cpp); torchao's
#   dynamic tensorwise Float8 likewise reads the input twice.
# mxfp8: one cast kernel, which also writes an E8M0 scale for every 32 elements in each direction.
FP8_CASTS: dict[str, tuple[float, int, bool, bool]] = {"delayed": (0.0, 1, False, True),
                                                       "tensorwise": (2.0, 3, True, True),
                                                       "mxfp8": (2.0 / 32, 1, True, False)}
NVFP4_CAST = (0.0, 1, False, False)  # Transformer Engine's NVFP4: block scales, gathered in both directions


@dataclass(frozen=True)
class Kernels:
    """A batch of kernels as arrays (any shapes that broadcast together)."""

    code: np.ndarray
    flops: np.ndarray
    nbytes: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    batch: np.ndarray
    precision: np.ndarray
    backward: np.ndarray
    count: np.ndarray | int = 1  # kernels each entry stands for (eager elementwise ops launch several)
    gpus: np.ndarray | int = 1  # GPUs kept in lockstep with this one (the plan's world): the slowest sets the pace
    cast: np.ndarray | None = None  # elements a low-precision GEMM's cast reads (None: its m x k x batch)


def kernel_seconds(hw: Hardware, dtype: str, kern: Kernels, attention_kernel: str = "best",
                   cuda_graphs: bool = False, wgrad_store_bytes: float | None = None,
                   fp8_recipe: str = "delayed") -> np.ndarray:
    """Seconds per kernel (see the module docstring); ``attention_kernel`` is the stack's
    (best | cudnn-2024 | fa2 | flex).

    With ``cuda_graphs`` the kernels are replayed from a CUDA graph: each pays
    ``graph_launch_us`` instead of the launch cost and no host dispatch time.
    ``wgrad_store_bytes``: bytes an element of a weight-gradient GEMM's output
    moves where the stack accumulates gradients in its epilogue (None: a BF16 write).
    """
    gpu, eff = hw.gpu, hw.gpu.efficiency
    low = dtype in LOW_PRECISION_RECIPES
    high = "bf16" if low else dtype
    launch = (eff.graph_launch_us if cuda_graphs else eff.launch_us) * 1e-6
    host = 0.0 if cuda_graphs else eff.host_us * 1e-6
    launches = np.asarray(kern.count, dtype=float)
    bandwidth = gpu.hbm_gbps * 1e9 * eff.memory_fraction
    memory = kern.nbytes / bandwidth
    lowp = (kern.precision != HIGH) & low
    slowest = eff.slowest_gpu_slowdown(kern.gpus)
    peak = np.where(lowp, gpu.sustained_peak(dtype) if low else 1.0, gpu.sustained_peak(high)) * 1e12 / slowest
    fraction = np.where(lowp, eff.matmul.fraction(dtype), eff.matmul.fraction(high))
    shaped = kern.m * kern.n * kern.k * kern.batch > 0
    padded = np.where(shaped, gemm_tiled_flops(np.maximum(kern.m, 1), np.maximum(kern.n, 1), kern.k,
                                               np.maximum(kern.batch, 1), eff.matmul, gpu.sm_count), kern.flops)
    cast_launches, cast = _cast_seconds(dtype, kern, launch, bandwidth, fp8_recipe)
    written = np.where(shaped, kern.m * kern.n * kern.batch * DTYPE_BYTES[high] / bandwidth, 0.0)
    reads = np.maximum(memory - written, 0.0)
    wgrad = (kern.precision == LOWP) & np.asarray(kern.backward, dtype=bool)
    store = written if wgrad_store_bytes is None else np.where(
        wgrad, written * (wgrad_store_bytes / DTYPE_BYTES[high]), written)
    # a GEMM of several kernels (one per expert) runs them GEMM_STREAMS at a time, their fixed costs overlapping
    gemm_rounds = np.ceil(np.maximum(launches, 1.0) / GEMM_STREAMS)
    matmul = launch * gemm_rounds + np.maximum(padded / (fraction * peak), reads) + store + cast
    attn_peak = gpu.sustained_peak(high) * 1e12 / slowest
    attention = launch + _attention_seconds(hw, kern, attention_kernel, attn_peak, slowest)
    # a kernel drawing a random number per element (dropout's Philox) streams at a share of the copy rate
    vector = launch * launches + memory / np.where(kern.code == 4, eff.random_fraction, 1.0)
    device = np.where(kern.code >= 3, vector, np.where(kern.code == 0, matmul, attention))
    dispatches = np.where(kern.code == 0, 1.0, launches)  # a GEMM's per-expert kernels leave one C++ call
    return np.maximum(device, host * (dispatches + cast_launches))


def _attention_seconds(hw: Hardware, kern: Kernels, attention_kernel: str, peak: float, slowest) -> np.ndarray:
    """A fused attention kernel, launch aside: its computed blocks at the kernel's share of peak, the
    exponentials it does not hide, and the fixed cost of each of its tiles (``tile_us``).

    Causal kernels skip the masked half but compute whole every block a mask edge cuts across: half a
    block of keys more per query row and edge than the row keeps (``kern.n`` keys per row and call,
    ``kern.m`` edges). The tiles are the query rows x heads (``kept scores / kern.n``) over the tile side;
    their cost was measured on cuDNN, so a FlashAttention-2 kernel, whose share was measured whole, pays none.
    FlexAttention was measured whole against the best kernel: it takes that kernel's time over its share.
    """
    gpu, eff = hw.gpu, hw.gpu.efficiency
    if attention_kernel == "flex":
        best = _attention_seconds(hw, kern, "best", peak, slowest)
        return best / np.where(kern.backward, eff.flex_share(backward=True), eff.flex_share(backward=False))
    tile = eff.attention_tile
    keys = np.maximum(kern.n, 1.0)
    edge = np.where(kern.n > 0, 1.0 + 0.5 * tile * kern.m / keys, 1.0)
    kept = kern.flops * np.where(kern.code == 2, 0.5, 1.0)
    computed = kept * edge
    attn_flops = computed * np.where(kern.backward, FLASH_BACKWARD_EXECUTED_FLOPS, 1.0)
    forward, backward = eff.attention_forward, eff.attention_backward
    attn_fraction = np.where(kern.backward, backward.fraction(attention_kernel, eff.fa2_attention_scale),
                             forward.fraction(attention_kernel, eff.fa2_attention_scale))
    scores = np.where(kern.k > 0, computed / np.maximum(kern.k, 1), 0.0)
    mma, exps = attn_flops / (attn_fraction * peak), gpu.exp_seconds(scores) * slowest
    tiles = np.where((kern.n > 0) & (kern.k > 0), kept / np.maximum(kern.k, 1) / keys / tile, 0.0)
    tile_us = np.where(kern.backward, backward.tile_us, forward.tile_us) if attention_kernel != "fa2" else 0.0
    tile_s = tiles * tile_us * 1e-6 / gpu.sm_count * slowest
    return mma + exps - eff.exps_hidden(attention_kernel) * np.minimum(mma, exps) + tile_s


def cast_launches(dtype: str, kern: Kernels, fp8_recipe: str = "delayed") -> np.ndarray:
    """Kernels each entry launches to cast its operand before a low-precision GEMM (0 for no cast)."""
    return _cast_plan(dtype, kern, fp8_recipe)[0]


def _cast_plan(dtype: str, kern: Kernels, fp8_recipe: str):
    """(kernels, bytes moved) of each entry's cast, as :data:`FP8_CASTS` says; zero where there is none."""
    extra, kernels, per_expert, transposes = FP8_CASTS[fp8_recipe] if dtype == "fp8" else NVFP4_CAST
    low = DTYPE_BYTES[dtype] if dtype in LOW_PRECISION_RECIPES else 0.0
    full = np.asarray(kern.m * kern.k * kern.batch, dtype=float)
    own = full if kern.cast is None else np.asarray(kern.cast, dtype=float)  # this rank's shard if gathered
    gathered = transposes & (own < full)
    casts = (low > 0) & (np.asarray(kern.precision) == LOWP_CAST) & (own > 0)
    launches = kernels * (np.maximum(kern.batch, 1) if per_expert else 1) + gathered
    moved = np.where(gathered, (2.0 + low + extra) * own + 2.0 * low * full, (2.0 + 2.0 * low + extra) * own)
    return np.where(casts, launches, 0), np.where(casts, moved, 0.0)


def _cast_seconds(dtype: str, kern: Kernels, launch: float, bandwidth: float, fp8_recipe: str):
    """Kernels and seconds of the cast before each low-precision GEMM that casts its activation operand."""
    launches, moved = _cast_plan(dtype, kern, fp8_recipe)
    return launches, launch * launches + moved / bandwidth


def grouped_kernel_seconds(hw: Hardware, dtype: str, kern: Kernels, groups, attention_kernel: str = "best",
                           cuda_graphs: bool = False, wgrad_store_bytes: float | None = None,
                           fp8_recipe: str = "delayed") -> np.ndarray:
    """:func:`kernel_seconds`, with each group of fused GEMMs priced as the one GEMM it is.

    ``groups`` labels each kernel (axis 0) with its fused GEMM (-1: none); a
    label modulo 4 is the dimension the members join on (0: m, 1: n, 2: k; see
    :func:`stageopt.graph.fusion.group_label`): the output columns of a fused QKV
    projection, the contracted columns of its data gradient, the rows of its
    weight gradient. The group is priced as that one GEMM and its members share
    its time in proportion to their FLOPs.
    """
    times = kernel_seconds(hw, dtype, kern, attention_kernel, cuda_graphs, wgrad_store_bytes, fp8_recipe)
    groups = np.asarray(groups)
    shape = np.broadcast_shapes(*(np.shape(getattr(kern, f)) for f in ("flops", "m", "n", "k", "batch")))
    full = {f: np.broadcast_to(np.asarray(getattr(kern, f), dtype=float), shape) for f in
            ("flops", "nbytes", "m", "n", "k", "batch")}
    for label in np.unique(groups[groups >= 0]):
        idx = np.flatnonzero(groups == label)
        joined = ("m", "n", "k")[label % 4]
        dims = {f: (full[f][idx].sum(axis=0) if f == joined else full[f][idx[0]])[None]
                for f in ("m", "n", "k", "batch")}
        flops = full["flops"][idx]
        cast = None if kern.cast is None else np.broadcast_to(np.asarray(kern.cast, dtype=float), shape)[idx]
        cast = None if cast is None else (cast.sum(axis=0) if joined == "k" else cast[0])[None]  # one input, or joined
        one = Kernels(code=np.zeros(1, dtype=int)[:, None] if flops.ndim > 1 else np.zeros(1, dtype=int),
                      flops=flops.sum(axis=0)[None], nbytes=full["nbytes"][idx].sum(axis=0)[None], cast=cast,
                      precision=np.asarray(kern.precision)[idx[:1]], backward=np.asarray(kern.backward)[idx[:1]],
                      count=np.broadcast_to(np.asarray(kern.count, dtype=float), shape)[idx[:1]], gpus=kern.gpus,
                      **dims)
        together = kernel_seconds(hw, dtype, one, attention_kernel, cuda_graphs, wgrad_store_bytes, fp8_recipe)[0]
        share = np.divide(flops, flops.sum(axis=0), out=np.full_like(flops, 1.0 / len(idx)),
                          where=flops.sum(axis=0) > 0)
        times[idx] = together * share
    return times


def chunked_kernel_seconds(hw: Hardware, dtype: str, kern: Kernels, groups, chunks=1, attention_kernel: str = "best",
                           wgrad_store_bytes: float | None = None, fp8_recipe: str = "delayed",
                           cuda_graphs: bool = False) -> np.ndarray:
    """:func:`grouped_kernel_seconds` with each GEMM run as ``chunks`` GEMMs of 1/chunks of its rows.

    Transformer Engine's userbuffer overlap runs the GEMM it pipelines so, one chunk per piece of
    communication (:func:`stageopt.graph.overlap.userbuffer_chunks`). Each chunk fills its own waves
    and stores its own output tiles, but the chunks go to :data:`UB_STREAMS` compute streams (its
    ``num_max_streams``), so their fixed costs overlap that many at a time: a GEMM of 4 chunks pays
    two launches, which a fused GEMM's members share as they share its time; its cast runs once.
    ``chunks`` broadcasts against the kernels' arrays.
    """
    if np.ndim(chunks) == 0 and chunks == 1:
        return grouped_kernel_seconds(hw, dtype, kern, groups, attention_kernel, cuda_graphs,
                                      wgrad_store_bytes=wgrad_store_bytes, fp8_recipe=fp8_recipe)
    chunks = np.asarray(chunks, dtype=float)
    scaled = Kernels(code=kern.code, flops=np.asarray(kern.flops) / chunks, nbytes=np.asarray(kern.nbytes) / chunks,
                     m=np.asarray(kern.m) / chunks, n=kern.n, k=kern.k, batch=kern.batch, precision=kern.precision,
                     backward=kern.backward, count=kern.count, gpus=kern.gpus,
                     cast=None if kern.cast is None else np.asarray(kern.cast) / chunks)
    times = chunks * grouped_kernel_seconds(hw, dtype, scaled, groups, attention_kernel, cuda_graphs,
                                            wgrad_store_bytes=wgrad_store_bytes, fp8_recipe=fp8_recipe)
    flops = np.broadcast_to(np.asarray(kern.flops, dtype=float), np.shape(times))
    groups = np.asarray(groups)
    share = np.ones_like(times)
    for label in np.unique(groups[groups >= 0]):
        idx = np.flatnonzero(groups == label)
        total = flops[idx].sum(axis=0)
        share[idx] = np.divide(flops[idx], total, out=np.full_like(flops[idx], 1.0 / len(idx)), where=total > 0)
    gemm = np.asarray(kern.code) == KERNEL_CODES["matmul"]
    launch = hw.gpu.efficiency.launch_us * 1e-6
    rounds = np.ceil(chunks / UB_STREAMS)  # the chunks' launches overlap UB_STREAMS at a time
    casts = cast_launches(dtype, kern, fp8_recipe)  # the cast runs once per GEMM
    return times - np.where(gemm, ((chunks - rounds) + (chunks - 1) * casts) * launch * share, 0.0)
