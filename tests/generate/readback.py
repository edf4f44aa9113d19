"""Totals read back from written trace files, by a path independent of the generator.

Only the Chakra reader is shared with the code under test; group kinds are
recovered from member sets (compared with ``stageopt.parallel.ranks.group_members``,
not the generator's group table), peers from ``pp_peer``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from stageopt.chakra import CommType, NodeType, node_attrs, read_comm_groups, read_trace
from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import group_members

TYPE_NAMES = {CommType.ALL_REDUCE: "all_reduce", CommType.ALL_GATHER: "all_gather",
              CommType.REDUCE_SCATTER: "reduce_scatter", CommType.ALL_TO_ALL: "all_to_all"}


@dataclass
class RankTotals:
    flops: int = 0
    tensor_bytes: int = 0
    comp_nodes: int = 0
    coll_bytes: Counter = field(default_factory=Counter)  # (member set, type) -> buffer bytes
    sent: int = 0
    received: int = 0
    send_peers: set = field(default_factory=set)
    recv_peers: set = field(default_factory=set)
    cpu_ops: int = 0
    zero_comp: int = 0


def rank_totals(directory: Path, rank: int, groups: dict[int, list[int]]) -> RankTotals:
    """Sum one rank's file. All-gather bytes are scaled back to the gathered buffer
    (the trace holds the per-rank input), as ``inspect`` quotes them."""
    out = RankTotals()
    for node in read_trace(directory / f"workload.{rank}.et").nodes:
        a = node_attrs(node)
        if a.get("is_cpu_op"):
            out.cpu_ops += 1
        if node.type == NodeType.COMP_NODE:
            out.flops += a["num_ops"]
            out.tensor_bytes += a["tensor_size"]
            out.comp_nodes += 1
            out.zero_comp += a["num_ops"] == 0 or a["tensor_size"] == 0
        elif node.type == NodeType.COMM_COLL_NODE:
            members = frozenset(groups[int(a["pg_name"])])
            kind = TYPE_NAMES[CommType(a["comm_type"])]
            scale = len(members) if kind == "all_gather" else 1
            out.coll_bytes[(members, kind)] += a["comm_size"] * scale
        elif node.type == NodeType.COMM_SEND_NODE:
            assert a["comm_src"] == rank
            out.sent += a["comm_size"]
            out.send_peers.add(a["comm_dst"])
        elif node.type == NodeType.COMM_RECV_NODE:
            assert a["comm_dst"] == rank
            out.received += a["comm_size"]
            out.recv_peers.add(a["comm_src"])
    return out


def expected_collectives(plan: Plan, stage_report: dict, rank: int, node_gpus: int = 8) -> Counter:
    """``inspect``'s per-(member set, type) byte totals for one rank.

    A group with several members in each of several nodes is written as its
    hierarchical phases (except ZeRO-3's): the members in this rank's node
    (``near``) and the members at this rank's position in every node (``far``).
    """
    out: Counter = Counter()
    for c in stage_report["collectives"]:
        members = sorted(group_members(plan, c["group"], rank))
        near = frozenset(m for m in members if m // node_gpus == rank // node_gpus)
        n_in, n = len(near), len(members)
        if n_in in (1, n) or c["phase"] == "zero3":
            out[(frozenset(members), c["type"])] += c["bytes_total"]
            continue
        far = frozenset(members[members.index(rank) % n_in::n_in])
        b = c["bytes_total"]
        phases = {"all_reduce": [(near, "reduce_scatter", b), (far, "all_reduce", b / n_in), (near, "all_gather", b)],
                  "all_gather": [(far, "all_gather", b / n_in), (near, "all_gather", b)],
                  "reduce_scatter": [(near, "reduce_scatter", b), (far, "reduce_scatter", b / n_in)],
                  "all_to_all": [(near, "all_to_all", b * n_in / n), (far, "all_to_all", b)]}[c["type"]]
        for group, kind, size in phases:
            out[(group, kind)] += size
    return out


def load_groups(directory: Path) -> dict[int, list[int]]:
    return read_comm_groups(directory / "comm_groups.json")
