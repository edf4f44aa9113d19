"""Communicator-group ids for a trace set: deterministic, O(world size) to build.

Every group of every kind a program uses gets a positive id: kinds in a fixed
order (tp, cp, ep, dp_cp, edp_cp, ...), groups of one kind in
:func:`stageopt.parallel.ranks.all_groups`'s row order. Two kinds whose groups
coincide (``edp_cp`` is ``dp_cp`` when ep = 1) share ids, so a set of ranks is
listed once. Kinds of size one have no groups (their collectives are dropped
from the programs). A rank's id for a kind is one array lookup.

A kind written ``<kind>@node`` or ``<kind>@nodes`` (see
:mod:`stageopt.program.tier_split`) is a kind's groups cut by node: the
members that share a node, or one member per node at the same position in it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import all_groups

KIND_ORDER = ("tp", "cp", "ep", "dp_cp", "edp_cp", "dp", "pp", "tp_dp_cp", "tp_edp_cp", "shard_cp", "replicate", "cpa",
              "embd")
TIER_PARTS = ("", "node", "nodes")  # a whole group, its members in one node, one member per node


def split_kind(kind: str) -> tuple[str, str]:
    """``"dp_cp@node"`` -> ``("dp_cp", "node")``; a plain kind has part ``""``."""
    base, _, part = kind.partition("@")
    return base, part


def members_per_node(rows: np.ndarray, node_gpus: int) -> int:
    """How many members of every group share a node, or 0 if that differs between nodes or groups."""
    if rows.size == 0:
        return 0
    nodes = rows // node_gpus
    n = rows.shape[1]
    per = int(np.count_nonzero(nodes[0] == nodes[0, 0]))
    if n % per:
        return 0
    blocks = nodes.reshape(len(rows), n // per, per)
    same = (blocks == blocks[:, :, :1]).all()
    distinct = per == n or (np.diff(blocks[:, :, 0], axis=1) > 0).all()
    return per if same and distinct else 0


def tier_rows(rows: np.ndarray, node_gpus: int, part: str) -> np.ndarray:
    """Groups cut by node: ``node`` keeps the members in one node together, ``nodes`` one per node."""
    if part == "":
        return rows
    per = members_per_node(rows, node_gpus)
    if per == 0:
        raise ValueError("group members are not spread evenly over nodes")
    blocks = rows.reshape(len(rows), rows.shape[1] // per, per)
    if part == "node":
        return blocks.reshape(-1, per)
    return blocks.transpose(0, 2, 1).reshape(-1, rows.shape[1] // per)


class GroupTable:
    """Group ids of the kinds in use; ``id_of(kind, rank)`` and the comm-group file contents."""

    def __init__(self, plan: Plan, kinds: Iterable[str], node_gpus: int = 1) -> None:
        self._ids: dict[str, np.ndarray] = {}
        self._rows: list[np.ndarray] = []  # member arrays, one per distinct set of groups, in id order
        self._first: list[int] = []  # id of the first group of each member array
        by_members: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}
        next_id = 1

        def order(kind: str) -> tuple[int, int]:
            base, part = split_kind(kind)
            return KIND_ORDER.index(base), TIER_PARTS.index(part)

        for kind in sorted(set(kinds), key=order):
            base, part = split_kind(kind)
            whole = all_groups(plan, base)
            if not whole.size:
                continue
            rows = tier_rows(whole, node_gpus, part)
            key = (rows.shape, rows.tobytes())  # kinds whose groups coincide share ids
            if key not in by_members:
                ids = np.empty(plan.gpus, dtype=np.int64)
                ids[rows] = np.arange(next_id, next_id + len(rows), dtype=np.int64)[:, None]
                by_members[key] = ids
                self._rows.append(rows)
                self._first.append(next_id)
                next_id += len(rows)
            self._ids[kind] = by_members[key]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._ids)

    def id_of(self, kind: str, rank: int) -> int:
        return int(self._ids[kind][rank])

    def ids_of_rank(self, rank: int) -> dict[str, str]:
        """``{kind: id as a string}`` for one rank: the ``pg_name`` patch of its trace."""
        return {kind: str(int(ids[rank])) for kind, ids in self._ids.items()}

    def comm_groups(self) -> dict[int, list[int]]:
        """``{id: [ranks]}`` for every group, ascending ids (ASTRA-sim's comm-group file)."""
        out: dict[int, list[int]] = {}
        for first, rows in zip(self._first, self._rows):
            for i, row in enumerate(rows.tolist()):
                out[first + i] = row
        return out
