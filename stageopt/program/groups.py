"""Communicator-group ids for a trace set: deterministic, O(world size) to build.

Every group of every kind a program uses gets a positive id: kinds in a fixed
order (tp, cp, ep, dp_cp, edp_cp, ...), groups of one kind in
:func:`stageopt.parallel.ranks.all_groups`'s row order. Two kinds whose groups
coincide (``edp_cp`` is ``dp_cp`` when ep = 1) share ids, so a set of ranks is
listed once. Kinds of size one have no groups (their collectives are dropped
from the programs). A rank's id for a kind is one array lookup.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import GROUP_AXES, all_groups

KIND_ORDER = ("tp", "cp", "ep", "dp_cp", "edp_cp", "dp", "edp", "pp", "tp_dp_cp", "tp_edp_cp")


class GroupTable:
    """Group ids of the kinds in use; ``id_of(kind, rank)`` and the comm-group file contents."""

    def __init__(self, plan: Plan, kinds: Iterable[str]) -> None:
        degrees = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "edp": plan.edp, "pp": plan.pp}
        self._ids: dict[str, np.ndarray] = {}
        self._rows: list[np.ndarray] = []  # member arrays, one per distinct kind, in id order
        self._first: list[int] = []  # id of the first group of each member array
        by_axes: dict[tuple[str, ...], np.ndarray] = {}
        next_id = 1
        for kind in sorted(set(kinds), key=KIND_ORDER.index):
            axes = tuple(a for a in GROUP_AXES[kind] if degrees[a] > 1)
            if not axes:
                continue
            if axes not in by_axes:
                rows = all_groups(plan, kind)
                ids = np.empty(plan.gpus, dtype=np.int64)
                ids[rows] = np.arange(next_id, next_id + len(rows), dtype=np.int64)[:, None]
                by_axes[axes] = ids
                self._rows.append(rows)
                self._first.append(next_id)
                next_id += len(rows)
            self._ids[kind] = by_axes[axes]

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
