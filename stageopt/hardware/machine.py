"""The hardware a plan runs on: GPU, NVLink domain, scale-out network, cost.

Why typed and frozen: a candidate in the search is (plan, hardware); hardware
objects are hashed, pickled to Ray workers and compared, and a co-design study
derives variants with :func:`apply_hw_overrides` instead of mutating one.

Units, everywhere: TFLOP/s dense (no 2:4 sparsity); HBM capacity in GiB; every
bandwidth in GB/s (1e9 bytes/s) per GPU in one direction; latency in µs;
cost in USD per GPU-hour. Presets live as YAML in ``simulators/hardware/``
(data, not code), each figure commented with its source.

Loading presets and overrides is :mod:`stageopt.hardware.presets`;
efficiency models are :mod:`stageopt.hardware.efficiency`, collective costs
:mod:`stageopt.hardware.collectives`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from stageopt.errors import ConfigError
from stageopt.frameworks.profile import LOW_PRECISION_RECIPES, FrameworkProfile
from stageopt.hardware.collectives import CollectiveAlgorithms, CollectiveKind, collective_time_s
from stageopt.hardware.efficiency import FLASH_BACKWARD_EXECUTED_FLOPS, GpuEfficiency, gemm_tiled_flops
from stageopt.hardware.headroom import default_reserve_gib
from stageopt.hardware.nccl_protocols import NcclTuning
from stageopt.inputs.limits import MAX_GPUS
from stageopt.inputs.schema import bounds, check_fields

DType = Literal["bf16", "fp16", "fp8", "nvfp4", "fp32", "tf32"]

# Tensor-core clock against board power under a power limit: clock ~ (limit / TDP) ** 0.63.
# Why 0.63: NVIDIA's base clock is the clock a part guarantees at its board power under heavy load;
# parts of one die at two board powers give the exponent: H100 SXM5 (700 W, 132 SMs, 1,590 MHz) and
# H100 PCIe (350 W, 114 SMs, 1,125 MHz) hold 0.71 of the clock at 0.58 of the power per SM; A100 SXM4
# (400 W, 1,275 MHz) and A100 PCIe 80GB (300 W, 1,065 MHz), both 108 SMs, 0.835 at 0.75: 0.63 both
# times (datasheet clocks). Memory-bound kernels are not slowed (HBM has its own clock).
POWER_CLOCK_EXPONENT = 0.63
# NVFP4 (Transformer Engine's block-scaled FP4): a 4-bit E2M1 value per element and one E4M3 scale per
# 16 elements, 4.5 bits an element (its per-tensor FP32 scale is negligible).
DTYPE_BYTES: dict[str, float] = {"bf16": 2, "fp16": 2, "fp8": 1, "nvfp4": 0.5625, "fp32": 4, "tf32": 4}
# The tensor-core peak a GEMM of each data type runs at (NVFP4 and MXFP4 share the FP4 peak).
PEAK_OF_DTYPE: dict[str, str] = {"nvfp4": "fp4"}

NodeTopology = Literal["switch", "fully_connected"]
ScaleOutTopology = Literal["fat_tree", "rail_optimized", "switch"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PeakTflops:
    """Dense peak TFLOP/s per data type; ``None`` means no tensor-core support."""

    bf16: float = field(metadata=bounds(gt=0))
    fp16: float = field(metadata=bounds(gt=0))
    fp8: float | None = field(metadata=bounds(gt=0))
    fp32: float = field(metadata=bounds(gt=0, doc="non-tensor FP32"))
    fp4: float | None = field(default=None, metadata=bounds(gt=0, doc="dense FP4 (Blackwell); null: none"))
    tf32: float | None = field(default=None, metadata=bounds(gt=0))

    def __post_init__(self) -> None:
        check_fields(self)

    def scaled(self, factor: float) -> PeakTflops:
        """Every dtype multiplied by ``factor`` (a faster chip of the same design)."""
        return PeakTflops(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name) * factor
                             for f in dataclasses.fields(self)})


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    """One accelerator: peak compute, HBM, SM count, and how close kernels get to peak.

    The scalar helpers below are the kernel model of :mod:`stageopt.hardware.kernels`
    for one kernel (that module prices arrays of kernels for every backend).
    """

    name: str
    peak_tflops: PeakTflops
    hbm_gib: float = field(metadata=bounds(gt=0))
    hbm_gbps: float = field(metadata=bounds(gt=0))
    sm_count: int = field(metadata=bounds(ge=1, doc="streaming multiprocessors (compute units)"))
    efficiency: GpuEfficiency
    reserve_gib: float | None = field(default=None, metadata=bounds(
        ge=0, doc="HBM kept free per GPU (CUDA context, NCCL, allocator); null: stageopt.hardware.headroom default"))
    tdp_w: float | None = field(default=None, metadata=bounds(
        gt=0, doc="board power the efficiency fractions hold at (the part's default power limit)"))
    power_limit_w: float | None = field(default=None, metadata=bounds(
        gt=0, doc="enforced power limit below tdp_w (nvidia-smi -pl); null: tdp_w"))
    exp_tops: float | None = field(default=None, metadata=bounds(
        gt=0, doc="exponentials per second (1e12) the special-function units compute: the softmax inside "
                  "flash attention; null: not priced"))
    host_link_gbps: float | None = field(default=None, metadata=bounds(
        gt=0, doc="GPU-to-host copy bandwidth per GPU per direction, GB/s (PCIe, NVLink-C2C): activation "
                  "offloading moves saved tensors over it; null: unknown, offloading refused"))
    peak_quoted_w: float | None = field(default=None, metadata=bounds(
        gt=0, doc="board power of the part whose dense peaks this part's datasheet repeats (GB300 quotes GB200's "
                  "at 1,200 W while it draws 1,400): its power headroom raises the sustained clock; null: its own"))
    peak_quoted_sms: int | None = field(default=None, metadata=bounds(
        ge=1, doc="SM count of that part (GB200: 148); with peak_quoted_w"))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.power_limit_w is not None and self.tdp_w is None:
            raise ConfigError(f"gpu {self.name}: power_limit_w needs tdp_w (the board power its efficiency "
                              f"fractions hold at); set gpu.tdp_w")
        if (self.peak_quoted_w is None) != (self.peak_quoted_sms is None) or (
                self.peak_quoted_w is not None and self.tdp_w is None):
            raise ConfigError(f"gpu {self.name}: peak_quoted_w and peak_quoted_sms go together, with tdp_w; "
                              f"set all three or neither")

    def clock_fraction(self) -> float:
        """Share of the TDP-level sustained clock the tensor cores keep under ``power_limit_w``.

        See :data:`POWER_CLOCK_EXPONENT`; a limit at or above the TDP changes nothing.
        """
        if self.power_limit_w is None or self.tdp_w is None:
            return 1.0
        return min(1.0, self.power_limit_w / self.tdp_w) ** POWER_CLOCK_EXPONENT

    def power_headroom(self) -> float:
        """Sustained tensor throughput over that of the part whose peaks this part's datasheet repeats
        (``peak_quoted_w``, ``peak_quoted_sms``), at equal quoted peaks: the clock law of
        :data:`POWER_CLOCK_EXPONENT` on power per SM, times the SM count. 1 without them.

        GB300 against GB200: (160 / 148) x ((1,400 / 160) / (1,200 / 148)) ** 0.63 = 1.134.
        """
        if self.peak_quoted_w is None or self.peak_quoted_sms is None or self.tdp_w is None:
            return 1.0
        per_sm = (self.tdp_w / self.sm_count) / (self.peak_quoted_w / self.peak_quoted_sms)
        return self.sm_count / self.peak_quoted_sms * per_sm ** POWER_CLOCK_EXPONENT

    def sustained_peak(self, dtype: DType = "bf16") -> float:
        """Dense peak TFLOP/s at the clock the power limit allows and the power headroom gives (what kernels
        are priced against; MFU stays against :meth:`peak`)."""
        return self.peak(dtype) * self.clock_fraction() * self.power_headroom()

    def exp_seconds(self, exps):
        """Seconds the special-function units take for ``exps`` exponentials (at the power-limited clock)."""
        if self.exp_tops is None:
            return np.zeros_like(np.asarray(exps, dtype=float))
        return np.asarray(exps, dtype=float) / (self.exp_tops * self.clock_fraction() * 1e12)

    def host_copy_seconds(self, nbytes):
        """Seconds to copy ``nbytes`` between this GPU's memory and the host's, one direction."""
        if self.host_link_gbps is None:
            raise ConfigError(f"gpu {self.name} has no host_link_gbps (GPU-to-host copy bandwidth, GB/s per "
                              "direction), which activation offloading needs; set it, e.g. "
                              "--hw-set gpu.host_link_gbps=64 for PCIe Gen5 x16")
        return np.asarray(nbytes, dtype=float) / (self.host_link_gbps * 1e9)

    def memory_reserve_gib(self) -> float:
        """HBM kept free for what is not the plan's tensors (see :mod:`stageopt.hardware.headroom`)."""
        return self.reserve_gib if self.reserve_gib is not None else default_reserve_gib(self.hbm_gib)

    def peak(self, dtype: DType = "bf16") -> float:
        """Dense peak TFLOP/s for ``dtype``; a ConfigError if the GPU lacks it."""
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"dtype {dtype!r} unknown; choose one of {', '.join(DTYPE_BYTES)}")
        key = PEAK_OF_DTYPE.get(dtype, dtype)
        value = getattr(self.peak_tflops, key)
        if value is None:
            raise ConfigError(f"gpu {self.name} has no {key} tensor cores (peak_tflops.{key} is null), which "
                              f"dtype={dtype} needs; use bf16 or another GPU")
        return float(value)

    def memory_time_s(self, nbytes: float) -> float:
        """Seconds to stream ``nbytes`` through HBM at the achievable fraction (no launch cost)."""
        return nbytes / (self.hbm_gbps * 1e9 * self.efficiency.memory_fraction)

    def matmul_time_s(self, m: int, n: int, k: int, dtype: DType = "bf16", batch: int = 1) -> float:
        """One (batched) GEMM: launch, the slower of whole-tile/whole-wave compute and the operand reads,
        then the output store (see :mod:`stageopt.hardware.kernels`).

        ``dtype`` is the precision the GEMM itself runs in (no FP8 cast kernel here); the output is BF16
        for the low-precision recipes.
        """
        if min(m, n, k, batch) <= 0:
            return 0.0
        eff = self.efficiency
        padded = float(gemm_tiled_flops(m, n, k, batch, eff.matmul, self.sm_count))
        compute = padded / (eff.matmul.fraction(dtype) * self.sustained_peak(dtype) * 1e12)
        reads = self.memory_time_s(batch * (m * k + k * n) * DTYPE_BYTES[dtype])
        store = self.memory_time_s(batch * m * n * DTYPE_BYTES["bf16" if dtype in LOW_PRECISION_RECIPES else dtype])
        return max(eff.launch_us * 1e-6 + max(compute, reads) + store, eff.host_us * 1e-6)

    def attention_time_s(self, flops: float, backward: bool = False, dtype: DType = "bf16",
                         flops_per_score: float = 0.0) -> float:
        """Seconds for the best fused attention kernel of ``flops`` (forward or backward): its matmuls and the
        exponential of each of its ``flops / flops_per_score`` scores (0: not priced), the share
        ``exp_overlap`` of the shorter of the two hidden under the other."""
        if flops <= 0:
            return 0.0
        eff = self.efficiency.attention_backward if backward else self.efficiency.attention_forward
        executed = flops * (FLASH_BACKWARD_EXECUTED_FLOPS if backward else 1.0)
        mma = executed / (eff.peak_fraction * self.sustained_peak(dtype) * 1e12)
        exps = self.exp_seconds(flops / flops_per_score if flops_per_score > 0 else 0.0)
        device = self.efficiency.launch_us * 1e-6 + mma + exps - self.efficiency.exps_hidden("best") * min(mma, exps)
        return max(device, self.efficiency.host_us * 1e-6)

    def vector_time_s(self, nbytes: float) -> float:
        """Seconds for one elementwise kernel moving ``nbytes`` through HBM."""
        return np.maximum(self.efficiency.launch_us * 1e-6 + self.memory_time_s(nbytes), self.efficiency.host_us * 1e-6)


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    """The scale-up (NVLink / Infinity Fabric) domain.

    ``bandwidth_gbps`` is what one GPU can send in total, in one direction, into
    the domain. For ``fully_connected`` it is spread over ``gpus - 1`` peer links.
    """

    gpus: int = field(metadata=bounds(ge=1, le=MAX_GPUS, doc="GPUs per scale-up domain"))
    bandwidth_gbps: float = field(metadata=bounds(gt=0))
    latency_us: float = field(metadata=bounds(ge=0))
    topology: NodeTopology = "switch"
    collectives: CollectiveAlgorithms = CollectiveAlgorithms()
    efficiency: float = field(default=1.0, metadata=bounds(gt=0.3, le=1.0, doc="bus bandwidth reached (nccl-tests)"))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleOut:
    """A network tier joining lower domains (InfiniBand / RoCE / Ethernet).

    ``nodes`` is how many lower-tier domains this tier joins at full bandwidth;
    ``None`` means as many as the job needs (non-blocking to any size).
    """

    bandwidth_gbps: float = field(metadata=bounds(gt=0))
    latency_us: float = field(metadata=bounds(ge=0))
    topology: ScaleOutTopology = "fat_tree"
    nodes: int | None = field(default=None, metadata=bounds(ge=2, le=MAX_GPUS))
    collectives: CollectiveAlgorithms = CollectiveAlgorithms()
    efficiency: float = field(default=1.0, metadata=bounds(gt=0.3, le=1.0, doc="bus bandwidth reached (nccl-tests)"))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Tier:
    """Uniform view of one network level, innermost first (see ``Hardware.tiers``)."""

    name: str
    members: int | None  # lower-level units joined here (GPUs for the node tier); None: unbounded
    bandwidth_gbps: float
    latency_us: float
    topology: str
    collectives: CollectiveAlgorithms
    efficiency: float = 1.0

    @property
    def achieved_gbps(self) -> float:
        """The bus bandwidth collectives reach on this tier (link bandwidth x efficiency)."""
        return self.bandwidth_gbps * self.efficiency

    def collective_time_s(self, kind: CollectiveKind, size_bytes: float, n: int) -> float:
        """α-β time of ``kind`` over ``n`` ranks that talk over this tier."""
        algo = self.collectives.for_kind(kind)
        return collective_time_s(kind, algo, size_bytes, n, self.achieved_gbps, self.latency_us)


@dataclass(frozen=True, kw_only=True, slots=True)
class Accuracy:
    """How far the preset's predictions fell from published runs when it was fitted: the throughput MAPE
    over the ``runs`` of its GPU ``family``, in sample and with each source held out of the fit
    (``experiments/validation/calibrate.py``; written into the preset by ``apply_calibration.py``)."""

    family: str
    machine: str  # Hardware.fingerprint() of the machine fitted: the record holds for it alone
    runs: int = field(metadata=bounds(ge=1, doc="published runs the figures cover"))
    in_sample_mape: float = field(metadata=bounds(ge=0, doc="throughput MAPE, %, fitted on every run"))
    held_out_mape: float = field(metadata=bounds(ge=0, doc="throughput MAPE, %, each source held out of the fit"))
    ranked_sweeps: int = field(default=0, metadata=bounds(ge=0, doc="families of plans measured on one cluster"))
    top1_regret: float = field(default=0.0, metadata=bounds(
        ge=0, doc="worst top-1 regret, %, over those sweeps: how much slower the predicted-best plan ran"))

    def __post_init__(self) -> None:
        check_fields(self)

    def describe(self) -> str:
        return (f"+/-{self.held_out_mape:.1f}% expected (throughput MAPE over the {self.runs} {self.family} runs "
                f"it was fitted to, each source held out of the fit; {self.in_sample_mape:.1f}% in sample)")

    def describe_ranking(self) -> str:
        """What the fit says of choosing between plans (a search's question), beside the per-plan error."""
        if not self.ranked_sweeps:
            return f"{self.describe()}; no published sweep of plans checks its ranking"
        sweeps = "sweep" if self.ranked_sweeps == 1 else "sweeps"
        return (f"+/-{self.held_out_mape:.1f}% per plan; in {self.ranked_sweeps} published {sweeps} of plans on "
                f"{self.family} the predicted-best plan ran at most {self.top1_regret:.1f}% slower than the best")


@dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    """A whole system: GPU type, scale-up domain, scale-out tier(s) and price."""

    name: str
    description: str = ""
    cost_per_gpu_hour: float = field(metadata=bounds(gt=0, doc="USD per GPU-hour"))
    gpu: Gpu
    node: Node
    scaleout: ScaleOut
    interpod: ScaleOut | None = None  # optional further tier joining scale-out pods
    nccl: NcclTuning | None = None  # NCCL's protocol choice prices ring collectives (None: one α-β ring per tier)
    accuracy: Accuracy | None = None  # validation record of a calibrated preset (None: never fitted)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.interpod is not None and self.scaleout.nodes is None:
            raise ConfigError("Hardware.interpod is set but scaleout.nodes is null; "
                              "give scaleout.nodes (nodes per pod) or drop interpod")

    def fingerprint(self) -> str:
        """A digest of everything that prices a step (not the name, description, price or accuracy record)."""
        plain = dataclasses.asdict(dataclasses.replace(self, name="", description="", cost_per_gpu_hour=1.0,
                                                       accuracy=None))
        if plain["nccl"] is not None:
            del plain["nccl"]["release"]  # the software's (a framework profile sets it per run), not the machine's
        return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def for_stack(self, framework: FrameworkProfile) -> Hardware:
        """This machine running ``framework``'s software: rings priced by the NCCL release the stack names."""
        release = framework.nccl_release
        if self.nccl is None or release is None or release == self.nccl.release:
            return self
        return dataclasses.replace(self, nccl=dataclasses.replace(self.nccl, release=release))

    @property
    def measured_accuracy(self) -> Accuracy | None:
        """The accuracy record where it was fitted on this very machine; None where there is none, or where the
        machine has changed since (an override, an edited copy of the file)."""
        record = self.accuracy
        return record if record is not None and record.machine == self.fingerprint() else None

    def accuracy_unknown(self) -> str:
        """Why no accuracy applies ('' where :attr:`measured_accuracy` does)."""
        if self.accuracy is None:
            return f"not measured: {self.name} was never fitted to measured runs (experiments/validation)"
        if self.measured_accuracy is None:
            return (f"not measured for this machine: it differs from the one {self.name}'s accuracy record was "
                    "fitted on (an override or an edited file)")
        return ""

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """Network levels from the NVLink domain outwards."""
        levels = [("node", self.node.gpus, self.node), ("scaleout", self.scaleout.nodes, self.scaleout)]
        if self.interpod is not None:
            levels.append(("interpod", self.interpod.nodes, self.interpod))
        return tuple(Tier(name=name, members=members, bandwidth_gbps=t.bandwidth_gbps,
                          latency_us=t.latency_us, topology=t.topology, collectives=t.collectives,
                          efficiency=t.efficiency)
                     for name, members, t in levels)
