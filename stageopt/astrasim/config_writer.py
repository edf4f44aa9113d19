"""ASTRA-sim system / network / memory inputs derived from a :class:`Hardware`.

Why derived, not hand-written: the analytical model, the replay and ASTRA-sim
must simulate the same machine, so ASTRA-sim's inputs are computed from the
same preset (after ``--hw-set`` overrides) rather than kept as parallel files.

Mapping (ASTRA-sim at commit 518bd51, analytical backend):

* network dimensions, innermost first: the NVLink domain (``Switch``, or
  ``FullyConnected`` for a mesh such as MI300X's Infinity Fabric), then the
  scale-out tier (``Switch``: the analytical backend models a fat tree or
  rail-optimized network as one non-blocking switch), then ``interpod`` if the
  hardware has it and the job spans more than one pod. A tier with a single
  member is left out. ``npus_count`` multiplies to the number of ranks.
* ``bandwidth``: the tier's *achieved* bus bandwidth (link bandwidth x the
  efficiency nccl-tests measures, ``Tier.achieved_gbps``), the figure
  :mod:`stageopt.hardware.network` times collectives and messages with.
  ASTRA-sim reads GB/s with 1 GB = 2^30 bytes, the presets give 1e9 bytes, so
  the value written is ``gbps * 1e9 / 2**30``. ``FullyConnected``
  bandwidth is per peer link: the GPU's total over ``node.gpus - 1`` links.
* ``latency`` (ns per hop): the tier's end-to-end ``latency_us`` divided by the
  hops a message takes (2 through a Switch, 1 on a direct link).
* system: ``system_defaults.json`` from ``simulators/astra-sim/`` (one chunk
  per collective, one chunk in flight: a collective is one pipelined
  transfer, as :mod:`stageopt.hardware.network` times it) plus one collective
  implementation per dimension (the tier's choice, ASTRA-sim's name).
  ``roofline-enabled`` is 0: every compute node carries stageopt's kernel
  time in ``duration_micros``. ``peak-perf`` is the dtype's dense peak
  (only read if a user turns the roofline back on).
* ``local-mem-bw``: with the roofline off ASTRA-sim uses it only to charge
  each received chunk a reduction of three passes over local memory, after
  the message and before the next send. NCCL reduces while it copies, and
  stageopt's collective model counts that inside the link bandwidth, so the
  value written (:data:`REDUCTION_FREE_MEM_BW`) makes the charge zero.
* ``subgroups_only``: ASTRA-sim runs a communicator group smaller than the
  world as one ring over its members and, when the system file lists more
  than one implementation, forces ``ring`` on it (so an all-to-all becomes a
  ring all-to-all, ``n/2`` times the traffic of a direct one). When no
  collective spans the whole multi-node world (the trace writer splits those
  by tier, :mod:`stageopt.program.tier_split`) and every tier uses the same
  algorithm for a collective, one implementation is written, which
  ASTRA-sim then uses on every group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stageopt.errors import ConfigError
from stageopt.hardware import SIMULATORS_DIR, DType, Hardware, Tier
from stageopt.hardware.collectives import ASTRA_SIM_NAMES, COLLECTIVE_KINDS

TEMPLATES_DIR = SIMULATORS_DIR / "astra-sim"
GIB = 2**30
REDUCTION_FREE_MEM_BW = 1_000_000_000  # GB/s: a reduction of any message ASTRA-sim sends rounds to 0 ns
_WRITTEN_SYSTEM_KEYS = ("all-reduce-implementation", "all-gather-implementation",
                        "reduce-scatter-implementation", "all-to-all-implementation",
                        "local-mem-bw", "peak-perf", "roofline-enabled")


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkDim:
    """One ASTRA-sim network dimension, in ASTRA-sim's units."""

    tier: Tier
    npus: int
    topology: str  # "Switch" | "FullyConnected"
    bandwidth_gib_s: float
    latency_ns: float


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraSimConfigFiles:
    """Paths of the three files :func:`write_astra_sim_configs` wrote."""

    system: Path
    network: Path
    memory: Path


def _tier_sizes(hw: Hardware, n_ranks: int) -> list[tuple[Tier, int]]:
    """Split ``n_ranks`` over the tiers, innermost first, or say why it cannot be."""
    if n_ranks < 2:
        raise ConfigError(f"n_ranks={n_ranks}: ASTRA-sim needs at least 2 ranks; use --gpus 2 or more")
    tiers = hw.tiers
    gpus = hw.node.gpus
    if n_ranks <= gpus:
        return [(tiers[0], n_ranks)]
    if n_ranks % gpus:
        raise ConfigError(f"n_ranks={n_ranks} is not a multiple of node.gpus={gpus}; use a multiple of {gpus} "
                          f"GPUs (whole scale-up domains)")
    sizes = [(tiers[0], gpus)] if gpus > 1 else []
    rest = n_ranks // gpus
    pod = hw.scaleout.nodes
    if pod is None or rest <= pod:
        return sizes + [(tiers[1], rest)]
    if hw.interpod is None:
        raise ConfigError(f"n_ranks={n_ranks} needs {rest} nodes but scaleout.nodes={pod} and no interpod tier; "
                          f"use at most {pod * gpus} GPUs or add an interpod tier")
    if rest % pod:
        raise ConfigError(f"n_ranks={n_ranks} spans {rest} nodes, not a multiple of scaleout.nodes={pod}; "
                          f"use a multiple of {pod * gpus} GPUs")
    pods = rest // pod
    if hw.interpod.nodes is not None and pods > hw.interpod.nodes:
        raise ConfigError(f"n_ranks={n_ranks} needs {pods} pods but interpod.nodes={hw.interpod.nodes}; "
                          f"use at most {hw.interpod.nodes * pod * gpus} GPUs")
    return sizes + [(tiers[1], pod), (tiers[2], pods)]


def network_dims(hw: Hardware, n_ranks: int) -> tuple[NetworkDim, ...]:
    """The ASTRA-sim network dimensions for ``n_ranks`` GPUs of ``hw``."""
    dims = []
    for tier, npus in _tier_sizes(hw, n_ranks):
        if tier.topology == "fully_connected":
            links = max(hw.node.gpus - 1, 1)
            dims.append(NetworkDim(tier=tier, npus=npus, topology="FullyConnected",
                                   bandwidth_gib_s=tier.achieved_gbps / links * 1e9 / GIB,
                                   latency_ns=tier.latency_us * 1e3))
        else:
            dims.append(NetworkDim(tier=tier, npus=npus, topology="Switch",
                                   bandwidth_gib_s=tier.achieved_gbps * 1e9 / GIB,
                                   latency_ns=tier.latency_us * 1e3 / 2))
    return tuple(dims)


def _implementation(dim: NetworkDim, algorithm: str) -> str:
    """ASTRA-sim's name for ``algorithm`` on ``dim``.

    A direct exchange through a switch shares the GPU's one link among its
    peers; the congestion-unaware backend would give every concurrent message
    the whole link, so it is written ``direct1`` (one message in flight), which
    moves the bytes at the link's rate, as :mod:`stageopt.hardware.collectives`
    prices ``direct``. A fully connected dimension has one link per peer, so
    there all messages go at once.
    """
    name = ASTRA_SIM_NAMES[algorithm]
    return "direct1" if name == "direct" and dim.topology == "Switch" else name


def _system_defaults() -> dict[str, Any]:
    path = TEMPLATES_DIR / "system_defaults.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read ASTRA-sim system defaults ({err}); restore the file") from None
    clash = sorted(set(data) & set(_WRITTEN_SYSTEM_KEYS))
    if clash:
        raise ConfigError(f"{path}: key(s) {', '.join(clash)} are derived from the hardware; remove them "
                          f"(use --hw-set instead)")
    return dict(data)


def astra_sim_configs(hw: Hardware, n_ranks: int, *, dtype: DType = "bf16", subgroups_only: bool = False,
                      host_copies: bool = False) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Return ``(system, network, memory)`` as ASTRA-sim reads them (JSON / YAML shapes).

    ``subgroups_only``: no collective of the trace set spans every rank (see
    the module docstring); then a collective whose algorithm is the same on
    every tier gets a one-entry implementation list. ``host_copies``: the
    traces hold MEM_LOAD/MEM_STORE nodes (activation offloading), timed by
    per-GPU remote memory at the GPU's host-link bandwidth (whole GB/s, as
    ASTRA-sim's remote-memory backend reads it).
    """
    dims = network_dims(hw, n_ranks)
    system = _system_defaults()
    for kind in COLLECTIVE_KINDS:
        key = kind.replace("_", "-") + "-implementation"
        names = [_implementation(d, d.tier.collectives.for_kind(kind)) for d in dims]
        system[key] = names[:1] if subgroups_only and len(set(names)) == 1 else names
    system["local-mem-bw"] = REDUCTION_FREE_MEM_BW
    system["roofline-enabled"] = 0
    system["peak-perf"] = round(hw.gpu.peak(dtype), 6)
    network = {
        "topology": [d.topology for d in dims],
        "npus_count": [d.npus for d in dims],
        "bandwidth": [round(d.bandwidth_gib_s, 6) for d in dims],
        "latency": [round(d.latency_ns, 6) for d in dims],
    }
    memory = json.loads((TEMPLATES_DIR / "memory.json").read_text(encoding="utf-8"))
    if host_copies:  # activation offloading's MEM nodes: each GPU's own link to host memory
        memory = {"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-latency": 0,
                  "remote-mem-bw": max(1, round(hw.gpu.host_link_gbps or 0))}
    return system, network, memory


def format_network_yaml(network: dict[str, Any], hw_name: str = "") -> str:
    """ASTRA-sim's network YAML (flow lists, one key a line, units in comments)."""
    def flow(values: list[Any]) -> str:
        return "[ " + ", ".join(str(v) for v in values) + " ]"

    head = f"# generated by stageopt from hardware '{hw_name}'\n" if hw_name else ""
    return (head
            + f"topology: {flow(network['topology'])}\n"
            + f"npus_count: {flow(network['npus_count'])}\n"
            + f"bandwidth: {flow(network['bandwidth'])}  # GB/s, 1 GB = 2^30 bytes\n"
            + f"latency: {flow(network['latency'])}  # ns per hop\n")


def write_astra_sim_configs(hw: Hardware, n_ranks: int, out_dir: Path, **options: Any) -> AstraSimConfigFiles:
    """Write ``system.json``, ``network.yml`` and ``memory.json`` into ``out_dir``."""
    system, network, memory = astra_sim_configs(hw, n_ranks, **options)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = AstraSimConfigFiles(system=out_dir / "system.json", network=out_dir / "network.yml",
                                memory=out_dir / "memory.json")
    files.system.write_text(json.dumps(system, indent=4) + "\n", encoding="utf-8")
    files.network.write_text(format_network_yaml(network, hw.name), encoding="utf-8")
    files.memory.write_text(json.dumps(memory, indent=4) + "\n", encoding="utf-8")
    return files
