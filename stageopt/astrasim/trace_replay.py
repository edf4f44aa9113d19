"""Replay a Chakra trace set exactly as ASTRA-sim's analytical backend would time it.

Glue only: read ``PREFIX.<rank>.et`` for every rank, turn each node into an
:class:`~stageopt.astrasim.events.Op` (computing roofline times here, as ASTRA-sim's
workload layer does at issue time), run :mod:`stageopt.astrasim.events`, and report
per rank what ASTRA-sim prints: ``sys[R] finished, T cycles, exposed
communication E cycles.`` with E = T - GPU compute time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stageopt.astrasim.collective_timing import SIMULATED_TYPES
from stageopt.astrasim.configs import (
    NetworkConfig,
    RemoteMemoryConfig,
    SystemConfig,
    read_memory_config,
    read_network_config,
    read_system_config,
)
from stageopt.astrasim.events import simulate
from stageopt.astrasim.records import Op, OpKind, Slot
from stageopt.chakra import CommType, NodeType, node_attrs, read_comm_groups, read_trace
from stageopt.chakra.comm_groups import check_groups_fit
from stageopt.console import progress as console_progress
from stageopt.errors import ConfigError, SimulatorError


@dataclass(frozen=True, slots=True)
class RankTiming:
    """One rank's line of ASTRA-sim output."""

    rank: int
    cycles: int
    exposed_comm_cycles: int

    def astra_line(self) -> str:
        return f"sys[{self.rank}] finished, {self.cycles} cycles, exposed communication {self.exposed_comm_cycles} cycles."


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Per-rank timings of one replay; the step time is the slowest rank (1 cycle = 1 ns)."""

    ranks: tuple[RankTiming, ...]

    @property
    def max_cycles(self) -> int:
        return max(r.cycles for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_cycles": self.max_cycles,
            "per_rank_cycles": [r.cycles for r in self.ranks],
            "per_rank_exposed_comm": [r.exposed_comm_cycles for r in self.ranks],
        }


def roofline_ns(num_ops: int, tensor_size: int, system: SystemConfig) -> int:
    """GPU time of a compute node under ASTRA-sim's roofline, in ns (truncated as ASTRA-sim does).

    perf = min(local_mem_bw x num_ops / tensor_size, peak_perf); time = num_ops / perf.
    A node without operations takes no time (ASTRA-sim's result would be 0/0).
    """
    if num_ops == 0:
        return 0
    ops = float(num_ops)
    intensity = ops / float(tensor_size)
    perf = min(system.local_mem_bw_bytes_per_s * intensity, system.peak_perf_flops)
    return int(ops / perf * 1e9)


def _int_attr(attrs: Mapping[str, object], name: str, where: str, default: int | None = None) -> int:
    value = attrs.get(name, default)
    if value is None:
        raise ConfigError(f"{where}: missing attribute {name!r}; ASTRA-sim needs it for this node type")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: attribute {name!r} must be an integer, got {value!r}; ASTRA-sim never reads a float as an integer")
    return value


def _group(attrs: Mapping[str, object], where: str) -> int:
    pg = attrs.get("pg_name", "")
    if not isinstance(pg, str):
        raise ConfigError(f"{where}: attribute 'pg_name' must be a string (the communicator-group id), got {pg!r}")
    if pg in ("", "0"):
        return 0
    if not pg.isdigit():
        raise ConfigError(f"{where}: pg_name {pg!r} is not a group id; use the id of a group in the comm-group file")
    return int(pg)


def _replay_ns(node: Any) -> int:
    """ASTRA-sim's replayed duration: duration_micros x 1000, or 1 ns when zero."""
    return node.duration_micros * 1000 if node.duration_micros else 1


def node_to_op(node: Any, rank: int, system: SystemConfig, where: str,
               memory: RemoteMemoryConfig | None = None) -> Op:
    """Translate one Chakra node into the engine's record (``memory``: the remote-memory file, for MEM nodes)."""
    attrs = node_attrs(node)
    deps = tuple(node.data_deps) + tuple(node.ctrl_deps)
    cpu = bool(attrs.get("is_cpu_op", False))
    ntype = node.type
    if ntype == NodeType.METADATA_NODE:
        raise ConfigError(f"{where}: METADATA_NODE in the node stream makes ASTRA-sim abort; remove it")
    if ntype in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
        return _memory_op(node, attrs, cpu, deps, memory, where)
    if ntype == NodeType.INVALID_NODE:
        return Op(node.id, OpKind.SKIP, Slot.CPU if cpu else Slot.COMM, deps)
    if ntype == NodeType.COMP_NODE:
        slot = Slot.CPU if cpu else Slot.GPU
        if system.roofline_enabled and not system.replay_only and not cpu:
            tensor_size = _int_attr(attrs, "tensor_size", where, 0)
            if tensor_size == 0:
                return Op(node.id, OpKind.SKIP, slot, deps)
            num_ops = _int_attr(attrs, "num_ops", where, 0)
            return Op(node.id, OpKind.COMPUTE, slot, deps, roofline_ns(num_ops, tensor_size, system), True)
        return Op(node.id, OpKind.COMPUTE, slot, deps, _replay_ns(node), not cpu)
    if ntype not in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
        raise ConfigError(f"{where}: unknown node type {ntype}; ASTRA-sim aborts on it")
    slot = Slot.NONE if ntype == NodeType.COMM_RECV_NODE else Slot.COMM
    if system.replay_only:
        return Op(node.id, OpKind.COMPUTE, Slot.CPU if cpu else slot, deps, _replay_ns(node), not cpu)
    if cpu:
        raise ConfigError(f"{where}: a communication node with is_cpu_op set makes ASTRA-sim abort; clear is_cpu_op")
    size = _int_attr(attrs, "comm_size", where)
    if ntype == NodeType.COMM_COLL_NODE:
        ctype = _int_attr(attrs, "comm_type", where)
        if ctype == CommType.BROADCAST:
            return Op(node.id, OpKind.DELAY, Slot.COMM, deps, _replay_ns(node))
        if ctype not in SIMULATED_TYPES:
            name = CommType(ctype).name if ctype in CommType._value2member_map_ else str(ctype)
            raise ConfigError(f"{where}: collective type {name} is not simulated by ASTRA-sim (it aborts); "
                              "use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL or BROADCAST")
        involved = attrs.get("involved_dim")
        dims = tuple(bool(v) for v in involved) if isinstance(involved, list) else None
        return Op(node.id, OpKind.COLLECTIVE, Slot.COMM, deps, comm_type=CommType(ctype), size=size,
                  group=_group(attrs, where), priority=_int_attr(attrs, "comm_priority", where, 0), involved_dims=dims)
    tag = _int_attr(attrs, "comm_tag", where, 0)
    if ntype == NodeType.COMM_SEND_NODE:
        src = _int_attr(attrs, "comm_src", where, rank)
        if src != rank:
            raise ConfigError(f"{where}: send node has comm_src={src}; a send must be issued by its source rank")
        return Op(node.id, OpKind.SEND, Slot.COMM, deps, size=size, peer=_int_attr(attrs, "comm_dst", where), tag=tag)
    dst = _int_attr(attrs, "comm_dst", where, rank)
    if dst != rank:
        raise ConfigError(f"{where}: receive node has comm_dst={dst}; a receive must be issued by its destination rank")
    return Op(node.id, OpKind.RECV, Slot.NONE, deps, size=size, peer=_int_attr(attrs, "comm_src", where), tag=tag)


def _memory_op(node: Any, attrs: Mapping[str, object], cpu: bool, deps: tuple[int, ...],
               memory: RemoteMemoryConfig | None, where: str) -> Op:
    """A MEM_LOAD/MEM_STORE node as ASTRA-sim runs it: on the CPU slot with is_cpu_op (else the communication
    slot), for the remote-memory backend's latency plus size over bandwidth (per-NPU memory only)."""
    if memory is None or memory.memory_type == "NO_MEMORY_EXPANSION":
        raise ConfigError(f"{where}: a MEM_LOAD/MEM_STORE node needs a remote-memory file with memory-type "
                          "PER_NPU_MEMORY_EXPANSION (ASTRA-sim aborts under NO_MEMORY_EXPANSION); pass --memory with "
                          "the memory.json written beside the traces")
    if memory.memory_type != "PER_NPU_MEMORY_EXPANSION":
        raise ConfigError(f"{where}: remote memory of type {memory.memory_type} (shared between NPUs) is not "
                          "modelled by the replay; use PER_NPU_MEMORY_EXPANSION")
    size = _int_attr(attrs, "tensor_size", where)
    return Op(node.id, OpKind.COMPUTE, Slot.CPU if cpu else Slot.COMM, deps, memory.access_ns(size), False)


def load_programs(prefix: str | os.PathLike, num_ranks: int, system: SystemConfig,
                  progress: bool = False, memory: RemoteMemoryConfig | None = None) -> list[list[Op]]:
    """Read ``PREFIX.<rank>.et`` for every rank and convert its nodes (``progress``: ranks read, rate, ETA)."""
    programs = []
    with console_progress(num_ranks, "reading traces", unit="rank", enabled=progress) as bar:
        for rank in range(num_ranks):
            path = f"{os.fspath(prefix)}.{rank}.et"
            if not os.path.exists(path):
                raise ConfigError(f"trace {path} does not exist; the network has {num_ranks} ranks, so PREFIX.0.et .. "
                                  f"PREFIX.{num_ranks - 1}.et are needed")
            trace = read_trace(path)
            programs.append([node_to_op(n, rank, system, f"{path} node {n.id}", memory) for n in trace.nodes])
            bar.update()
    return programs


def replay_programs(programs: Sequence[Sequence[Op]], groups: Mapping[int, Sequence[int]],
                    system: SystemConfig, network: NetworkConfig, progress: bool = False) -> ReplayResult:
    """Run prepared programs; a rank that never finishes is an error, as ASTRA-sim would hang.

    ``progress``: trace nodes finished of all ranks, with rate and ETA, on stderr.
    """
    total = sum(len(p) for p in programs)
    with console_progress(total, "replaying", unit="node", enabled=progress) as bar:
        results = simulate(programs, groups, system, network,
                           on_tick=(lambda engine: bar.update(engine.nodes_finished() - bar.n)) if progress else None)
        stuck = [r for r, res in enumerate(results) if res.finish_ns is None]
        if not stuck:
            bar.update(total - bar.n)  # every node of every rank finished
    if stuck:
        raise SimulatorError(
            f"rank(s) {stuck} never finish: a dependency or message is never satisfied (e.g. a send without a "
            "matching receive, or a collective on a one-rank group), so ASTRA-sim would not finish either"
        )
    return ReplayResult(tuple(
        RankTiming(r, res.finish_ns, res.finish_ns - res.compute_ns)  # type: ignore[operator]
        for r, res in enumerate(results)
    ))


def replay_trace_set(workload: str | os.PathLike, comm_group: str | os.PathLike | None,
                     system_path: str | os.PathLike, network_path: str | os.PathLike,
                     progress: bool = False, memory_path: str | os.PathLike | None = None) -> ReplayResult:
    """Replay ``workload.<rank>.et`` with ASTRA-sim's config files; the command-line entry point."""
    system = read_system_config(system_path)
    memory = read_memory_config(memory_path) if memory_path else None
    network = read_network_config(network_path)
    groups = read_comm_groups(comm_group) if comm_group else {}
    if comm_group:
        check_groups_fit(groups, network.num_npus, comm_group, f"the network {network_path}")
    programs = load_programs(workload, network.num_npus, system, progress, memory)
    if not comm_group:
        _require_no_groups(programs, workload)
    return replay_programs(programs, groups, system, network, progress)


def _require_no_groups(programs: Sequence[Sequence[Op]], workload: str | os.PathLike) -> None:
    """Without a group file, name the missing argument rather than a missing group."""
    for rank, ops in enumerate(programs):
        for op in ops:
            if op.kind == OpKind.COLLECTIVE and op.group:
                folder = os.path.dirname(os.fspath(workload)) or "."
                raise ConfigError(f"rank {rank}: node {op.id} uses communicator group {op.group}, but no --comm-group "
                                  f"file was given; pass the one written with the traces "
                                  f"(e.g. {os.path.join(folder, 'comm_groups.json')})")
