"""Collectives as the stack issues them: data-parallel ones in buckets, node-spanning ones by tier.

Buckets: :func:`stageopt.program.durations.collective_buckets` says how many
collectives a data-parallel node stands for (each pays the collective's
latency); :func:`split_buckets` writes that many, chained, with the bytes
shared out exactly, so ASTRA-sim pays the same latencies.

Tiers:

ASTRA-sim 518bd51 runs any communicator group smaller than the world as one
ring over its members. For a group with several members in each of several
nodes that ring mixes NVLink and scale-out hops, and the congestion-unaware
backend lets the slow hops carry several messages at once, so it comes out
about 25% faster than either NCCL or stageopt's model
(:func:`stageopt.hardware.network.collective_time`: NCCL's multi-channel
ring, bound by the smaller of NVLink and the node's NICs). The trace writer
spells such a collective out as the hierarchical phases NCCL's tree and
NVLS algorithms use, each on a group that lives in one tier: ``<kind>@node``
(the members sharing a node) and ``<kind>@nodes`` (one member per node, same
position in it; :mod:`stageopt.program.groups`). Each phase is then a plain
ring (or direct exchange) on uniform links, which ASTRA-sim times exactly;
the remaining difference from the ring model (a few percent) is named in the
astra-sim backend's output.

Phases, for ``n = n_in * n_out`` members and buffer ``S`` (``c`` = an
all-gather's per-rank input):

* all-reduce: reduce-scatter ``S`` @node, all-reduce ``S/n_in`` @nodes,
  all-gather ``S/n_in`` per rank @node;
* all-gather: all-gather ``c`` @nodes, then ``c * n_out`` @node;
* reduce-scatter: ``S`` @node, then ``S/n_in`` @nodes;
* all-to-all: ``S/n_out`` @node, then ``S`` @nodes (the share bound for
  other nodes crosses the scale-out tier once).

"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import all_groups
from stageopt.program.durations import collective_buckets
from stageopt.program.groups import members_per_node
from stageopt.program.nodes import COLL, ProgramNode, StageProgram
from stageopt.program.params import ceil_div



def split_kinds(plan: Plan, kinds: set[str], node_gpus: int) -> dict[str, int]:
    """``{kind: members per node}`` for the kinds whose groups span nodes with several members in each."""
    out = {}
    for kind in sorted(kinds):
        rows = all_groups(plan, kind)
        per = members_per_node(rows, node_gpus)
        if 1 < per < rows.shape[1]:
            out[kind] = per
    return out


def phases(node: ProgramNode, n_in: int) -> list[tuple[str, str, int]]:
    """``(collective, group kind, comm_size)`` of each phase of one split collective."""
    n_out = node.group_size // n_in
    node_kind, nodes_kind = f"{node.group}@node", f"{node.group}@nodes"
    size = node.comm_size
    if node.collective == "all_reduce":
        part = ceil_div(size, n_in)
        return [("reduce_scatter", node_kind, size), ("all_reduce", nodes_kind, part), ("all_gather", node_kind, part)]
    if node.collective == "all_gather":
        return [("all_gather", nodes_kind, size), ("all_gather", node_kind, size * n_out)]
    if node.collective == "reduce_scatter":
        return [("reduce_scatter", node_kind, size), ("reduce_scatter", nodes_kind, ceil_div(size, n_in))]
    return [("all_to_all", node_kind, ceil_div(size, n_out)), ("all_to_all", nodes_kind, size)]


def split_program(program: StageProgram, micros: np.ndarray, split: dict[str, int]) -> tuple[StageProgram, np.ndarray]:
    """The program with every collective on a kind of ``split`` replaced by its phases, chained.

    Ids stay contiguous and in topological order; a node that waited for a
    split collective waits for its last phase. ``micros`` (per node) follows
    the renumbering; phases get 0 (ASTRA-sim simulates them).
    """
    if not split:
        return program, micros
    new_id: dict[int, int] = {}
    nodes: list[ProgramNode] = []
    out_micros: list[int] = []

    def remap(deps: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(new_id[d] for d in deps)

    for n, m in zip(program.nodes, micros.tolist()):
        data, ctrl = remap(n.data_deps), remap(n.ctrl_deps)
        if n.type != COLL or n.group not in split:
            new_id[n.id] = len(nodes)
            nodes.append(replace(n, id=len(nodes), data_deps=data, ctrl_deps=ctrl))
            out_micros.append(m)
            continue
        for collective, kind, size in phases(n, split[n.group]):
            size_of = split[n.group] if kind.endswith("@node") else n.group_size // split[n.group]
            nodes.append(replace(n, id=len(nodes), name=f"{n.name}/{collective}@{kind.split('@')[1]}",
                                 data_deps=data, ctrl_deps=ctrl, collective=collective, group=kind,
                                 group_size=size_of, comm_size=size))
            out_micros.append(0)
            data, ctrl = (len(nodes) - 1,), ()
        new_id[n.id] = len(nodes) - 1
    return StageProgram(stage=program.stage, nodes=tuple(nodes)), np.array(out_micros, dtype=np.int64)


def _shares(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` integers that differ by at most one and sum exactly."""
    q, r = divmod(total, parts)
    return [q + 1] * r + [q] * (parts - r)


def split_buckets(program: StageProgram, micros: np.ndarray, plan: Plan) -> tuple[StageProgram, np.ndarray]:
    """The program with every data-parallel collective written as its buckets, chained (see above)."""
    new_id: dict[int, int] = {}
    nodes: list[ProgramNode] = []
    out_micros: list[int] = []
    for n, m in zip(program.nodes, micros.tolist()):
        data, ctrl = tuple(new_id[d] for d in n.data_deps), tuple(new_id[d] for d in n.ctrl_deps)
        whole = n.comm_size * (n.group_size if n.collective == "all_gather" else 1)
        parts = int(collective_buckets(n, whole, plan)) if n.type == COLL else 1
        parts = min(parts, max(n.comm_size, 1))
        if parts <= 1:
            new_id[n.id] = len(nodes)
            nodes.append(replace(n, id=len(nodes), data_deps=data, ctrl_deps=ctrl))
            out_micros.append(m)
            continue
        for i, size in enumerate(_shares(n.comm_size, parts)):
            nodes.append(replace(n, id=len(nodes), name=f"{n.name}/bucket{i}", data_deps=data, ctrl_deps=ctrl,
                                 comm_size=size))
            out_micros.append(0)
            data, ctrl = (len(nodes) - 1,), ()
        new_id[n.id] = len(nodes) - 1
    return StageProgram(stage=program.stage, nodes=tuple(nodes)), np.array(out_micros, dtype=np.int64)
