"""Rank layout and communicator groups.

Ranks are numbered with TP innermost (so a TP group sits inside one node),
then CP, then DP (whose inner factor is EP), and PP outermost:
``rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))`` with
``dp_i = ep_i + ep * edp_i``, ``cp_i = cpa_i + cpa * ring_i`` (hierarchical CP)
and ``edp_i = dps_i + dps * dpr_i``, where hybrid sharding (``Plan.dp_shard``) cuts
data parallelism into shards (inner, ``dps``) and their replicas (outer, ``dpr``;
degree 1 unless hybrid). With EP folded over TP, ``ep`` is dp's factor ep / tp. A group is the
set of ranks that differ only in the coordinates of its axes. Groups of one
rank are never produced: an axis of degree 1 has no group.
"""

from __future__ import annotations

import numpy as np

from stageopt.parallel.plan import Plan

# Group kinds and the coordinate axes they span. "dp_cp" reduces dense
# gradients; "edp_cp" reduces expert gradients; "ep" carries all-to-alls;
# with hybrid sharding "shard_cp" holds one sharded copy of the dense states
# and "replicate" all-reduces across the copies. Context parallelism is "cpa"
# (the all-to-all part of the hierarchical mix, degree 1 otherwise) inside
# "cp" (the rest: the ring, or all of cp).
GROUP_AXES: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "ep": ("ep",),
    "dp": ("ep", "dps", "dpr"),
    "edp": ("dps", "dpr"),
    "pp": ("pp",),
    "dp_cp": ("cpa", "cp", "ep", "dps", "dpr"),
    "edp_cp": ("cpa", "cp", "dps", "dpr"),
    "tp_dp_cp": ("tp", "cpa", "cp", "ep", "dps", "dpr"),
    "tp_edp_cp": ("tp", "cpa", "cp", "dps", "dpr"),
    "shard_cp": ("cpa", "cp", "ep", "dps"),
    "replicate": ("dpr",),
    "cpa": ("cpa",),
}
_COORD_ORDER = ("tp", "cpa", "cp", "ep", "dps", "dpr", "pp")


def axis_degrees(plan: Plan) -> dict[str, int]:
    """Degree of every coordinate axis of the rank layout."""
    return {"tp": plan.tp, "cpa": plan.cpa, "cp": plan.cp // plan.cpa, "ep": plan.ep_dp,
            "dps": plan.edp // plan.dp_replicate, "dpr": plan.dp_replicate, "pp": plan.pp}


def dense_dp_groups(plan: Plan) -> tuple[str, str]:
    """Where dense gradients are reduced: the group that shards them, and the group that then
    all-reduces the shards across replicas ("" without hybrid sharding)."""
    return ("shard_cp", "replicate") if plan.dp_replicate > 1 else ("dp_cp", "")


def expert_dp_group(plan: Plan) -> str:
    """Where expert gradients are reduced: over the TP ranks too when experts are whole on each (etp=1)
    and the TP ranks are not expert-parallel themselves (folding)."""
    return "tp_edp_cp" if plan.expert_tp == 1 and plan.tp > 1 and not plan.ep_folded else "edp_cp"


def axes_of(plan: Plan, kind: str) -> tuple[str, ...]:
    """The coordinate axes of a ``kind`` group on this plan: expert parallelism folded over TP spans tp too."""
    return ("tp", "ep") if kind == "ep" and plan.ep_folded else GROUP_AXES[kind]


def coords_of(plan: Plan, rank: int) -> dict[str, int]:
    """Coordinates of a rank on every axis (plus ``dp``)."""
    out: dict[str, int] = {}
    rest = rank
    for axis in _COORD_ORDER:
        deg = axis_degrees(plan)[axis]
        out[axis] = rest % deg
        rest //= deg
    degrees = axis_degrees(plan)
    out["edp"] = out["dps"] + degrees["dps"] * out["dpr"]
    out["dp"] = out["ep"] + degrees["ep"] * out["edp"]  # the ep coordinate is dp's factor (ep / tp when folded)
    return out


def rank_of(plan: Plan, coords: dict[str, int]) -> int:
    rank, stride = 0, 1
    for axis in _COORD_ORDER:
        rank += coords.get(axis, 0) * stride
        stride *= axis_degrees(plan)[axis]
    return rank


def group_size(plan: Plan, kind: str) -> int:
    return int(np.prod([axis_degrees(plan)[a] for a in axes_of(plan, kind)]))


def group_members(plan: Plan, kind: str, rank: int) -> list[int]:
    """Ranks in the ``kind`` group that contains ``rank`` (ascending)."""
    base = coords_of(plan, rank)
    axes = axes_of(plan, kind)
    members = [rank_of(plan, {**base, **dict(zip(axes, idx))})
               for idx in np.ndindex(*[axis_degrees(plan)[a] for a in axes])]
    return sorted(members)


def all_groups(plan: Plan, kind: str) -> np.ndarray:
    """Every ``kind`` group as rows of an int array (shape groups x size), or empty if size 1.

    Built by reshaping the rank grid, so it costs O(world size).
    """
    size = group_size(plan, kind)
    if size == 1:
        return np.zeros((0, 1), dtype=np.int64)
    degs = axis_degrees(plan)
    # grid[pp, dpr, dps, ep, cp, cpa, tp] holds the rank; move the group's axes last.
    shape = [degs[a] for a in reversed(_COORD_ORDER)]
    grid = np.arange(plan.gpus, dtype=np.int64).reshape(shape)
    names = list(reversed(_COORD_ORDER))
    axes = axes_of(plan, kind)
    keep = [names.index(a) for a in names if a not in axes]
    moved = [names.index(a) for a in reversed(_COORD_ORDER) if a in axes]
    return np.sort(grid.transpose(keep + moved).reshape(-1, size), axis=1)


def pp_peer(plan: Plan, rank: int, stage: int) -> int:
    """The rank holding the same non-PP coordinates on pipeline stage ``stage``."""
    return rank_of(plan, {**coords_of(plan, rank), "pp": stage})


def group_stride(plan: Plan, kind: str) -> int:
    """Rank distance between neighbouring members of a ``kind`` group (1 for TP).

    Axes of degree 1 are skipped: with cp = 1 an expert-gradient group
    (``edp_cp``) steps by ``tp * ep``, not ``tp``.
    """
    stride = 1
    axes = axes_of(plan, kind)
    degrees = axis_degrees(plan)
    for axis in _COORD_ORDER:
        if axis in axes and degrees[axis] > 1:
            return stride
        stride *= degrees[axis]
    return stride
