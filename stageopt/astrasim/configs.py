"""Typed readers for ASTRA-sim's system JSON and analytical network YAML.

ASTRA-sim (``Sys::initialize_sys``) silently ignores keys it does not know and
leaves some settings uninitialised when a key is missing. Here every key is
checked: an unknown key, a missing required key or a bad value is a
:class:`~stageopt.errors.ConfigError` that names the file, the key and a fix,
so a typo never turns into a silently different simulation.

Units follow ASTRA-sim at commit 518bd51: ``peak-perf`` is TFLOP/s (x1e12),
``local-mem-bw`` is GB/s with 1 GB = 1e9 bytes (roofline and reduction time),
while network ``bandwidth`` is GB/s with 1 GB = 2^30 bytes and ``latency`` ns.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from enum import Enum
from typing import Any

from stageopt.errors import ConfigError
from stageopt.inputs.gate import load_document, shorten
from stageopt.inputs.limits import MAX_GPUS, check_finite


class CollectiveAlgo(str, Enum):
    """Per-dimension collective implementations the replay simulates."""

    RING = "ring"
    DIRECT = "direct"
    HALVING_DOUBLING = "halvingDoubling"


class SchedulingPolicy(str, Enum):
    """Order of chunks waiting in a dimension queue (``scheduling-policy``)."""

    LIFO = "LIFO"
    FIFO = "FIFO"
    EXPLICIT = "EXPLICIT"


class Topology(str, Enum):
    """Building block of one network dimension."""

    RING = "Ring"
    FULLY_CONNECTED = "FullyConnected"
    SWITCH = "Switch"


@dataclass(frozen=True, slots=True)
class AlgoSpec:
    """One entry of an ``*-implementation`` list; ``window`` only for ``directN``."""

    algo: CollectiveAlgo
    window: int = -1


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemConfig:
    """The parts of an ASTRA-sim system file that change timing."""

    scheduling_policy: SchedulingPolicy
    endpoint_delay_ns: int
    active_chunks_per_dimension: int
    preferred_dataset_splits: int
    all_reduce: tuple[AlgoSpec, ...]
    all_gather: tuple[AlgoSpec, ...]
    reduce_scatter: tuple[AlgoSpec, ...]
    all_to_all: tuple[AlgoSpec, ...]
    local_bw_aware: bool
    local_mem_bw_gbps: float
    roofline_enabled: bool
    peak_perf_tflops: float
    replay_only: bool

    @property
    def local_mem_bw_bytes_per_s(self) -> float:
        """``local-mem-bw`` as ASTRA-sim scales it (x1e9)."""
        return self.local_mem_bw_gbps * 1e9

    @property
    def peak_perf_flops(self) -> float:
        """``peak-perf`` as ASTRA-sim scales it (x1e12)."""
        return self.peak_perf_tflops * 1e12


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkConfig:
    """A (multi-dimensional) analytical network: one entry per dimension."""

    topology: tuple[Topology, ...]
    npus_count: tuple[int, ...]
    bandwidth_gbps: tuple[float, ...]
    latency_ns: tuple[float, ...]

    @property
    def num_npus(self) -> int:
        """Ranks in the system: the product of ``npus_count``."""
        total = 1
        for n in self.npus_count:
            total *= n
        return total

    @property
    def dims(self) -> int:
        return len(self.topology)


# Keys ASTRA-sim reads but that cannot change congestion-unaware timing here
# (statistics, tracing, LogGP parameters that only matter with a shared bus).
_IGNORED_SYSTEM_KEYS = frozenset(
    {"boost-mode", "local-reduction-delay", "trace-enabled", "track-local-mem",
     "local-mem-trace-filename", "L", "o", "g", "G"}
)
_IMPL_KEYS = {
    "all-reduce-implementation": "all_reduce",
    "all-gather-implementation": "all_gather",
    "reduce-scatter-implementation": "reduce_scatter",
    "all-to-all-implementation": "all_to_all",
}
_SYSTEM_KEYS = frozenset(
    {"scheduling-policy", "endpoint-delay", "active-chunks-per-dimension",
     "preferred-dataset-splits", "collective-optimization", "local-mem-bw",
     "roofline-enabled", "peak-perf", "replay-only", "model-shared-bus"}
    | set(_IMPL_KEYS) | _IGNORED_SYSTEM_KEYS
)
_REQUIRED_SYSTEM_KEYS = ("scheduling-policy", "preferred-dataset-splits", "collective-optimization", *_IMPL_KEYS)


def _load(path: os.PathLike | str, kind: str) -> Any:
    """Parse a JSON (system) or YAML (network) file through the input gate: one line on any problem."""
    return load_document(path, f"{kind} config", json_file=kind in ("system", "remote-memory"))


MAX_SPLITS = 1024  # chunks per collective: ASTRA-sim's configs use 1-64; replay work grows linearly with it
MIN_RATE = 1e-3  # GB/s or TFLOP/s: below it a rate is a typo, and its nanoseconds overflow the replay's clock


def _number(path: os.PathLike | str, key: str, value: Any, *, minimum: float, integer: bool = False,
            maximum: float | None = None) -> Any:
    """A finite numeric value in ``[minimum, maximum]`` (maximum: the gate's sanity bound unless given)."""
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        want = "an integer" if integer else "a number"
        raise ConfigError(f"{path}: {key!r} must be {want} >= {minimum:g}, got {shorten(value)}")
    check_finite(value, f"{path}: {key!r}")
    if value < minimum:
        want = "an integer" if integer else "a number"
        raise ConfigError(f"{path}: {key!r} must be {want} >= {minimum:g}, got {shorten(value)}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{path}: {key!r} = {shorten(value)} is above {maximum:g} (ASTRA-sim's configs use 1-64, "
                          "and the replay's work grows with it); give a smaller value")
    return value


def _algo(path: os.PathLike | str, key: str, name: Any) -> AlgoSpec:
    """Parse one implementation name as ASTRA-sim's CollectiveImplLookup does."""
    if name == "ring":
        return AlgoSpec(CollectiveAlgo.RING)
    if name == "halvingDoubling":
        return AlgoSpec(CollectiveAlgo.HALVING_DOUBLING)
    if isinstance(name, str) and name.startswith("direct"):
        tail = name[len("direct"):]
        if tail == "":
            return AlgoSpec(CollectiveAlgo.DIRECT)
        if tail.isdigit() and int(tail) > 0:
            return AlgoSpec(CollectiveAlgo.DIRECT, int(tail))
    raise ConfigError(
        f"{path}: {key!r} entry {shorten(name)} is not supported by the replay; "
        "use 'ring', 'direct', 'directN' or 'halvingDoubling'"
    )


def _check_system_keys(path: os.PathLike | str, data: dict) -> None:
    for key in data:
        if key not in _SYSTEM_KEYS:
            close = difflib.get_close_matches(str(key), sorted(_SYSTEM_KEYS), n=1)
            fix = f"did you mean '{close[0]}'?" if close else "ASTRA-sim's system keys are hyphenated, e.g. endpoint-delay"
            raise ConfigError(f"{path}: unknown key {shorten(key)}; {fix}")


def read_system_config(path: os.PathLike | str) -> SystemConfig:
    """Read an ASTRA-sim system JSON (``--system-configuration``)."""
    data = _load(path, "system")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of system settings, got {type(data).__name__}")
    _check_system_keys(path, data)
    for key in sorted(_IGNORED_SYSTEM_KEYS & set(data)):  # not used here, but ASTRA-sim reads them
        if key == "local-mem-trace-filename":
            if not isinstance(data[key], str):
                raise ConfigError(f"{path}: {key!r} must be a file name, got {shorten(data[key])}")
        else:
            _number(path, key, data[key], minimum=0)
    for key in _REQUIRED_SYSTEM_KEYS:
        if key not in data:
            raise ConfigError(f"{path}: missing key {key!r}; ASTRA-sim needs it (see configs in shared/reference)")
    policy = data["scheduling-policy"]
    if policy not in tuple(p.value for p in SchedulingPolicy):
        raise ConfigError(f"{path}: 'scheduling-policy' must be LIFO, FIFO or EXPLICIT, got {shorten(policy)}")
    optimization = data["collective-optimization"]
    if optimization not in ("baseline", "localBWAware"):
        raise ConfigError(f"{path}: 'collective-optimization' must be 'baseline' or 'localBWAware', got {shorten(optimization)}")
    if data.get("model-shared-bus", 0) not in (0, False):
        raise ConfigError(f"{path}: 'model-shared-bus' = 1 (LogGP bus model) is not supported by the replay; set it to 0")
    impls: dict[str, tuple[AlgoSpec, ...]] = {}
    for key, field in _IMPL_KEYS.items():
        names = data[key]
        if not isinstance(names, list) or not names:
            raise ConfigError(f"{path}: {key!r} must be a non-empty list with one implementation per dimension")
        impls[field] = tuple(_algo(path, key, n) for n in names)
    roofline = _number(path, "roofline-enabled", data.get("roofline-enabled", 0), minimum=0) != 0
    if roofline:
        for key in ("peak-perf", "local-mem-bw"):
            if key not in data:
                raise ConfigError(f"{path}: missing key {key!r}; the roofline (roofline-enabled = 1) needs it")
            if _number(path, key, data[key], minimum=0) <= 0:
                raise ConfigError(f"{path}: {key!r} = {data[key]!r} must be > 0 with roofline-enabled = 1 (compute "
                                  "time divides by it); give the GPU's value or set roofline-enabled to 0")
    bw = _number(path, "local-mem-bw", data.get("local-mem-bw", 0), minimum=0)
    _check_rates(path, bw, data["peak-perf"] if roofline else None)
    return SystemConfig(
        scheduling_policy=SchedulingPolicy(policy),
        endpoint_delay_ns=_number(path, "endpoint-delay", data.get("endpoint-delay", 10), minimum=0, integer=True),
        active_chunks_per_dimension=_number(
            path, "active-chunks-per-dimension", data.get("active-chunks-per-dimension", 1), minimum=1, integer=True,
            maximum=MAX_SPLITS,
        ),
        preferred_dataset_splits=_number(
            path, "preferred-dataset-splits", data["preferred-dataset-splits"], minimum=1, integer=True,
            maximum=MAX_SPLITS,
        ),
        local_bw_aware=optimization == "localBWAware",
        local_mem_bw_gbps=float(bw),
        roofline_enabled=roofline,
        peak_perf_tflops=float(_number(path, "peak-perf", data.get("peak-perf", 0), minimum=0)),
        replay_only=_number(path, "replay-only", data.get("replay-only", 0), minimum=0) != 0,
        **impls,
    )


def _check_rates(path: os.PathLike | str, local_mem_bw: float, peak_perf: float | None) -> None:
    """Rates the replay divides by: 0 local memory bandwidth makes reductions free, a tiny one is a typo."""
    if 0 < local_mem_bw < MIN_RATE:
        raise ConfigError(f"{path}: 'local-mem-bw' = {shorten(local_mem_bw)} GB/s is below {MIN_RATE:g}: reductions "
                          "would take longer than the replay's clock can count; give the GPU's value (GB/s) or 0")
    if peak_perf is not None and peak_perf < MIN_RATE:
        raise ConfigError(f"{path}: 'peak-perf' = {shorten(peak_perf)} TFLOP/s is below {MIN_RATE:g}; "
                          "give the GPU's value")


_NETWORK_KEYS = ("topology", "npus_count", "bandwidth", "latency")


def read_network_config(path: os.PathLike | str) -> NetworkConfig:
    """Read an analytical-backend network YAML (``--network-configuration``)."""
    data = _load(path, "network")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping with keys {', '.join(_NETWORK_KEYS)}")
    for key in data:
        if key not in _NETWORK_KEYS:
            raise ConfigError(f"{path}: unknown key {shorten(key)}; a network file has exactly {', '.join(_NETWORK_KEYS)}")
    for key in _NETWORK_KEYS:
        if key not in data:
            raise ConfigError(f"{path}: missing key {key!r}; give one value per dimension, e.g. {key}: [ ... ]")
        if not isinstance(data[key], list) or not data[key]:
            raise ConfigError(f"{path}: {key!r} must be a non-empty list (one value per dimension)")
    dims = len(data["topology"])
    for key in _NETWORK_KEYS[1:]:
        if len(data[key]) != dims:
            raise ConfigError(f"{path}: {key!r} has {len(data[key])} entries but 'topology' has {dims}; give one per dimension")
    topologies = []
    for name in data["topology"]:
        if name not in tuple(t.value for t in Topology):
            raise ConfigError(f"{path}: 'topology' entry {shorten(name)} is unknown; use Ring, FullyConnected or Switch")
        topologies.append(Topology(name))
    counts = tuple(_number(path, "npus_count", n, minimum=2, integer=True) for n in data["npus_count"])
    total = 1
    for n in counts:
        total *= n
    if total > MAX_GPUS:
        raise ConfigError(f"{path}: 'npus_count' {shorten(list(counts))} multiplies to {total:.3g} NPUs, above the "
                          f"bound {MAX_GPUS:.0e} (the largest clusters have ~10^6 GPUs); check for a typo")
    bandwidths = tuple(float(_number(path, "bandwidth", b, minimum=0)) for b in data["bandwidth"])
    if any(b < MIN_RATE for b in bandwidths):
        raise ConfigError(f"{path}: 'bandwidth' values must be at least {MIN_RATE:g} GB/s, got "
                          f"{shorten(list(bandwidths))}")
    latencies = tuple(float(_number(path, "latency", x, minimum=0)) for x in data["latency"])
    return NetworkConfig(topology=tuple(topologies), npus_count=counts, bandwidth_gbps=bandwidths, latency_ns=latencies)


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteMemoryConfig:
    """ASTRA-sim's remote-memory file (``--remote-memory-configuration``): how MEM_LOAD/MEM_STORE nodes are timed.

    Its analytical backend times an access as ``remote-mem-latency`` ns plus
    ``tensor_size / remote-mem-bw`` ns (bandwidth an integer in GB/s);
    ``NO_MEMORY_EXPANSION`` aborts on any access.
    """

    memory_type: str
    latency_ns: int = 0
    bandwidth_gbps: int = 0

    def access_ns(self, nbytes: int) -> int:
        """ASTRA-sim's time for one access of ``nbytes`` (integer nanoseconds, as it computes them)."""
        return self.latency_ns + int(nbytes / self.bandwidth_gbps)


MEMORY_TYPES = ("NO_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION", "MEMORY_POOL")


def read_memory_config(path: os.PathLike | str) -> RemoteMemoryConfig:
    """Read an ASTRA-sim remote-memory JSON."""
    data = _load(path, "remote-memory")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of remote-memory settings, got {type(data).__name__}")
    kind = data.get("memory-type", "NO_MEMORY_EXPANSION")
    if kind not in MEMORY_TYPES:
        raise ConfigError(f"{path}: 'memory-type' must be one of {', '.join(MEMORY_TYPES)}, got {shorten(kind)}")
    latency = _number(path, "remote-mem-latency", data.get("remote-mem-latency", 0), minimum=0, integer=True)
    bandwidth = _number(path, "remote-mem-bw", data.get("remote-mem-bw", 0), minimum=0, integer=True)
    if kind != "NO_MEMORY_EXPANSION" and bandwidth < 1:
        raise ConfigError(f"{path}: 'remote-mem-bw' must be a whole number of GB/s >= 1 with memory-type {kind} "
                          "(ASTRA-sim divides by it)")
    return RemoteMemoryConfig(memory_type=kind, latency_ns=int(latency), bandwidth_gbps=int(bandwidth))
