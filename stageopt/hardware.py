"""The hardware a plan runs on: GPU, NVLink domain, scale-out network, cost.

Why typed and frozen: a candidate in the search is (plan, hardware); hardware
objects are hashed, pickled to Ray workers and compared, and a co-design study
derives variants with :func:`apply_hw_overrides` instead of mutating one.

Units, everywhere: TFLOP/s dense (no 2:4 sparsity); HBM capacity in GiB; every
bandwidth in GB/s (1e9 bytes/s) per GPU in one direction; latency in µs;
cost in USD per GPU-hour. Presets live as YAML in ``simulators/hardware/``
(data, not code), each figure commented with its source.

Public API: :class:`Hardware` (with :class:`Gpu`, :class:`PeakTflops`,
:class:`Node`, :class:`ScaleOut`, the uniform :class:`Tier` view),
:func:`load_hardware`, :func:`apply_hw_overrides`, :func:`list_hardware_presets`,
:func:`hw_override_keys`. Efficiency models are in
:mod:`stageopt.hardware_efficiency`, collective costs in
:mod:`stageopt.hardware_collectives`, ASTRA-sim configs in
:mod:`stageopt.hardware_astrasim`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from stageopt.errors import ConfigError
from stageopt.hardware_collectives import CollectiveAlgorithms, CollectiveKind, collective_time_s
from stageopt.hardware_efficiency import GpuEfficiency
from stageopt.hardware_schema import (
    bounds,
    check_fields,
    field_paths,
    from_mapping,
    is_group,
    load_yaml_mapping,
    parse_text,
    replace_path,
)

DType = Literal["bf16", "fp16", "fp8", "fp32", "tf32"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4, "tf32": 4}

NodeTopology = Literal["switch", "fully_connected"]
ScaleOutTopology = Literal["fat_tree", "rail_optimized", "switch"]

SIMULATORS_DIR = Path(__file__).resolve().parents[1] / "simulators"
PRESETS_DIR = SIMULATORS_DIR / "hardware"


@dataclass(frozen=True, kw_only=True, slots=True)
class PeakTflops:
    """Dense peak TFLOP/s per data type; ``None`` means no tensor-core support."""

    bf16: float = field(metadata=bounds(gt=0))
    fp16: float = field(metadata=bounds(gt=0))
    fp8: float | None = field(metadata=bounds(gt=0))
    fp32: float = field(metadata=bounds(gt=0, doc="non-tensor FP32"))
    tf32: float | None = field(default=None, metadata=bounds(gt=0))

    def __post_init__(self) -> None:
        check_fields(self)

    def scaled(self, factor: float) -> PeakTflops:
        """Every dtype multiplied by ``factor`` (a faster chip of the same design)."""
        return PeakTflops(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name) * factor
                             for f in dataclasses.fields(self)})


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    """One accelerator: peak compute, HBM, and how close kernels get to peak."""

    name: str
    peak_tflops: PeakTflops
    hbm_gib: float = field(metadata=bounds(gt=0))
    hbm_gbps: float = field(metadata=bounds(gt=0))
    efficiency: GpuEfficiency

    def __post_init__(self) -> None:
        check_fields(self)

    def peak(self, dtype: DType = "bf16") -> float:
        """Dense peak TFLOP/s for ``dtype``; a ConfigError if the GPU lacks it."""
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"dtype {dtype!r} unknown; choose one of {', '.join(DTYPE_BYTES)}")
        value = getattr(self.peak_tflops, dtype)
        if value is None:
            raise ConfigError(f"gpu {self.name} has no {dtype} tensor cores (peak_tflops.{dtype} is null); "
                              f"use bf16 or another GPU")
        return float(value)

    def memory_time_s(self, nbytes: float) -> float:
        """Seconds to stream ``nbytes`` through HBM at the achievable fraction."""
        return nbytes / (self.hbm_gbps * 1e9 * self.efficiency.memory_fraction)

    def matmul_time_s(self, m: int, n: int, k: int, dtype: DType = "bf16", batch: int = 1) -> float:
        """Roofline of one (batched) GEMM: the slower of compute and reading A, B and writing C."""
        eff = self.efficiency.matmul
        compute = eff.compute_time_s(m, n, k, self.peak(dtype), batch)
        if compute == 0.0:
            return 0.0
        traffic = batch * (m * k + k * n + m * n) * DTYPE_BYTES[dtype]
        return max(compute, eff.overhead_us * 1e-6 + self.memory_time_s(traffic))

    def attention_time_s(self, flops: float, backward: bool = False, dtype: DType = "bf16") -> float:
        """Seconds for a fused attention kernel of ``flops`` (forward or backward)."""
        eff = self.efficiency.attention_backward if backward else self.efficiency.attention_forward
        return eff.time_s(flops, self.peak(dtype))


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    """The scale-up (NVLink / Infinity Fabric) domain.

    ``bandwidth_gbps`` is what one GPU can send in total, in one direction, into
    the domain. For ``fully_connected`` it is spread over ``gpus - 1`` peer links.
    """

    gpus: int = field(metadata=bounds(ge=1, doc="GPUs per scale-up domain"))
    bandwidth_gbps: float = field(metadata=bounds(gt=0))
    latency_us: float = field(metadata=bounds(ge=0))
    topology: NodeTopology = "switch"
    collectives: CollectiveAlgorithms = CollectiveAlgorithms()

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
    nodes: int | None = field(default=None, metadata=bounds(ge=2))
    collectives: CollectiveAlgorithms = CollectiveAlgorithms()

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

    def collective_time_s(self, kind: CollectiveKind, size_bytes: float, n: int) -> float:
        """α-β time of ``kind`` over ``n`` ranks that talk over this tier."""
        algo = self.collectives.for_kind(kind)
        return collective_time_s(kind, algo, size_bytes, n, self.bandwidth_gbps, self.latency_us)


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

    def __post_init__(self) -> None:
        check_fields(self)
        if self.interpod is not None and self.scaleout.nodes is None:
            raise ConfigError("Hardware.interpod is set but scaleout.nodes is null; "
                              "give scaleout.nodes (nodes per pod) or drop interpod")

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """Network levels from the NVLink domain outwards."""
        levels = [("node", self.node.gpus, self.node), ("scaleout", self.scaleout.nodes, self.scaleout)]
        if self.interpod is not None:
            levels.append(("interpod", self.interpod.nodes, self.interpod))
        return tuple(Tier(name=name, members=members, bandwidth_gbps=t.bandwidth_gbps,
                          latency_us=t.latency_us, topology=t.topology, collectives=t.collectives)
                     for name, members, t in levels)


# ----------------------------------------------------------------------------- loading


def list_hardware_presets() -> list[str]:
    """Names of the YAML presets shipped in ``simulators/hardware/``."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def hardware_from_dict(data: Mapping[str, object], where: str = "hardware") -> Hardware:
    """Build a :class:`Hardware` from a parsed mapping, strictly (see hardware_schema)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of hardware keys, got {type(data).__name__}")
    return from_mapping(Hardware, data, where)


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Load a preset by name (``h100-sxm``) or a YAML file by path."""
    text = str(name_or_path)
    is_file = isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text
    if is_file:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"hardware file {text!r} not found; give an existing .yaml file or a preset name "
                              f"({', '.join(list_hardware_presets())})")
    else:
        path = PRESETS_DIR / f"{text}.yaml"
        if not path.is_file():
            known = list_hardware_presets()
            close = difflib.get_close_matches(text, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"unknown hardware preset {text!r}; {hint}known presets: {', '.join(known)} "
                              f"(or pass a path to a .yaml file)")
    return hardware_from_dict(load_yaml_mapping(path), where=path.name)


def hw_override_keys() -> list[str]:
    """Every dotted key ``--hw-set`` accepts (scalars, plus ``gpu.peak_tflops``)."""
    keys = [p for p, tp in field_paths(Hardware) if not is_group(tp)]
    return sorted(keys + ["gpu.peak_tflops"])


def apply_hw_overrides(hw: Hardware, overrides: Iterable[str]) -> Hardware:
    """Return ``hw`` with each ``"dotted.key=value"`` applied, left to right.

    Any scalar field is settable by its dotted path (``node.bandwidth_gbps=900``,
    ``gpu.efficiency.matmul.peak_fraction=0.7``, ``gpu.peak_tflops.fp8=2000``).
    ``gpu.peak_tflops=X`` sets the bf16 peak to X and scales every other dtype
    by the same factor. Each result is re-validated.
    """
    paths = dict(field_paths(Hardware))
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--hw-set {item!r} is not key=value; write e.g. --hw-set node.bandwidth_gbps=900")
        if key == "gpu.peak_tflops":
            target = float(parse_text(float, raw, key))  # type: ignore[arg-type]
            try:
                hw = replace_path(hw, ["gpu", "peak_tflops"], hw.gpu.peak_tflops.scaled(target / hw.gpu.peak_tflops.bf16))
            except ConfigError as err:
                raise ConfigError(f"--hw-set {item}: {err}") from None
            continue
        if key not in paths:
            close = difflib.get_close_matches(key, hw_override_keys(), n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else "see stageopt.hardware.hw_override_keys()"
            raise ConfigError(f"--hw-set key '{key}' is not a hardware field; {hint}")
        tp = paths[key]
        if is_group(tp):
            subkeys = [k for k in hw_override_keys() if k.startswith(key + ".")]
            raise ConfigError(f"--hw-set key '{key}' is a group, not a value; set one of {', '.join(subkeys)}")
        value = parse_text(tp, raw, key)
        try:
            hw = _replace_creating(hw, key.split("."), value)
        except ConfigError as err:
            raise ConfigError(f"--hw-set {item}: {err}") from None
    return hw


def _replace_creating(hw: Hardware, path: list[str], value: object) -> Hardware:
    """replace_path, except that an absent optional tier (``interpod``) cannot be half-set."""
    if path[0] == "interpod" and hw.interpod is None and len(path) > 1:
        raise ConfigError("interpod is not defined in this hardware; add an interpod section to a YAML "
                          "file (bandwidth_gbps, latency_us) instead of setting one field")
    return replace_path(hw, path, value)
