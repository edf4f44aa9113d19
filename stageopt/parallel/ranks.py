"""Rank layout and communicator groups.

Ranks are numbered with TP innermost (so a TP group sits inside one node),
then CP, then DP, and PP outermost:
``rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))`` with
``cp_i = cpa_i + cpa * ring_i`` (hierarchical CP) and ``dp_i = dps_i + dps * dpr_i``,
where hybrid sharding (``Plan.dp_shard``) cuts data parallelism into shards
(inner, ``dps``) and their replicas (outer, ``dpr``; degree 1 unless hybrid).

Expert layers see the same ranks factored another way, as Megatron-Core builds
them (its expert rank generator, order tp-ep-dp-pp): a pipeline stage's
``tp * cp * dp`` ranks are ``etp`` (expert TP, innermost) x ``ep`` x expert-DP,
so expert parallelism takes the ranks right after expert TP. With etp = tp that
is CP first, then DP; with etp = 1 it folds over TP too (MoE parallel folding).

A group is the set of ranks that differ only in the coordinates of its axes.
Groups of one rank are never produced: an axis of degree 1 has no group.
"""

from __future__ import annotations

import numpy as np

from stageopt.parallel.plan import Plan

# Group kinds and the coordinate axes they span. "dp_cp" reduces dense
# gradients; "edp_cp" reduces expert gradients (named "tp_edp_cp" when etp=1
# keeps experts whole on TP ranks); "ep" carries all-to-alls; with hybrid
# sharding "shard_cp" holds one sharded copy of the dense states and "replicate"
# all-reduces across the copies. Context parallelism is "cpa" (the all-to-all
# part of the hierarchical mix, degree 1 otherwise) inside "cp" (the rest: the
# ring, or all of cp). Axes "etp", "xep" and "xdp" are the expert factoring.
GROUP_AXES: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "ep": ("xep",),
    "dp": ("dps", "dpr"),
    "pp": ("pp",),
    "dp_cp": ("cpa", "cp", "dps", "dpr"),
    "edp_cp": ("xdp",),
    "tp_dp_cp": ("tp", "cpa", "cp", "dps", "dpr"),
    "tp_edp_cp": ("xdp",),
    "shard_cp": ("cpa", "cp", "dps"),
    "replicate": ("dpr",),
    "cpa": ("cpa",),
}
# "embd" is no product of axes: the first and the last pipeline stage's ranks of the same other
# coordinates, which share the tied input and output embedding and all-reduce its gradient every step
# (Megatron's embedding group, finalize_model_grads; DeepSpeed's tied-weight groups).
EMBEDDING_GROUP = "embd"
_DENSE_ORDER = ("tp", "cpa", "cp", "dps", "dpr", "pp")
_EXPERT_ORDER = ("etp", "xep", "xdp", "pp")


def axis_degrees(plan: Plan) -> dict[str, int]:
    """Degree of every coordinate axis of both factorings of the ranks."""
    return {"tp": plan.tp, "cpa": plan.cpa, "cp": plan.cp // plan.cpa, "dps": plan.shard_dp,
            "dpr": plan.dp_replicate, "pp": plan.pp,
            "etp": plan.expert_tp, "xep": plan.ep, "xdp": plan.expert_dp_ranks}


def _order(axes) -> tuple[str, ...]:
    """The factoring (dense or expert) whose axes these are."""
    return _EXPERT_ORDER if any(a in _EXPERT_ORDER[:3] for a in axes) else _DENSE_ORDER


def dense_dp_groups(plan: Plan) -> tuple[str, str]:
    """Where dense gradients are reduced: the group that shards them, and the group that then
    all-reduces the shards across replicas ("" without hybrid sharding)."""
    return ("shard_cp", "replicate") if plan.dp_replicate > 1 else ("dp_cp", "")


def expert_dp_group(plan: Plan) -> str:
    """Where expert gradients are reduced: ``tp_edp_cp`` when etp=1 keeps experts whole on the TP
    ranks (each rank's gradient is then a partial sum that this group completes, with no TP sum)."""
    return "tp_edp_cp" if plan.expert_tp == 1 and plan.tp > 1 else "edp_cp"


def coords_of(plan: Plan, rank: int) -> dict[str, int]:
    """Coordinates of a rank on every axis of both factorings (plus ``dp``)."""
    out: dict[str, int] = {}
    degrees = axis_degrees(plan)
    for order in (_DENSE_ORDER, _EXPERT_ORDER):
        rest = rank
        for axis in order:
            out[axis] = rest % degrees[axis]
            rest //= degrees[axis]
    out["dp"] = out["dps"] + degrees["dps"] * out["dpr"]
    return out


def rank_of(plan: Plan, coords: dict[str, int], order: tuple[str, ...] = _DENSE_ORDER) -> int:
    rank, stride = 0, 1
    degrees = axis_degrees(plan)
    for axis in order:
        rank += coords.get(axis, 0) * stride
        stride *= degrees[axis]
    return rank


def group_size(plan: Plan, kind: str) -> int:
    if kind == EMBEDDING_GROUP:
        return 2 if plan.pp > 1 else 1
    return int(np.prod([axis_degrees(plan)[a] for a in GROUP_AXES[kind]]))


def group_members(plan: Plan, kind: str, rank: int) -> list[int]:
    """Ranks in the ``kind`` group that contains ``rank`` (ascending)."""
    base = coords_of(plan, rank)
    if kind == EMBEDDING_GROUP:
        return sorted({rank_of(plan, {**base, "pp": 0}), rank_of(plan, {**base, "pp": plan.pp - 1})})
    axes = GROUP_AXES[kind]
    members = [rank_of(plan, {**base, **dict(zip(axes, idx))}, _order(axes))
               for idx in np.ndindex(*[axis_degrees(plan)[a] for a in axes])]
    return sorted(members)


def all_groups(plan: Plan, kind: str) -> np.ndarray:
    """Every ``kind`` group as rows of an int array (shape groups x size), or empty if size 1.

    Built by reshaping the rank grid, so it costs O(world size).
    """
    size = group_size(plan, kind)
    if size == 1:
        return np.zeros((0, 1), dtype=np.int64)
    if kind == EMBEDDING_GROUP:  # pp is the outermost axis: the first and the last block of ranks
        stage = plan.gpus // plan.pp
        first = np.arange(stage, dtype=np.int64)
        return np.stack([first, first + (plan.pp - 1) * stage], axis=1)
    degs = axis_degrees(plan)
    axes = GROUP_AXES[kind]
    order = _order(axes)
    # grid[pp, dpr, dps, cp, cpa, tp] (or [pp, xdp, xep, etp]) holds the rank; move the group's axes last.
    shape = [degs[a] for a in reversed(order)]
    grid = np.arange(plan.gpus, dtype=np.int64).reshape(shape)
    names = list(reversed(order))
    keep = [names.index(a) for a in names if a not in axes]
    moved = [names.index(a) for a in reversed(order) if a in axes]
    return np.sort(grid.transpose(keep + moved).reshape(-1, size), axis=1)


def pp_peer(plan: Plan, rank: int, stage: int) -> int:
    """The rank holding the same non-PP coordinates on pipeline stage ``stage``."""
    return rank_of(plan, {**coords_of(plan, rank), "pp": stage})


def group_stride(plan: Plan, kind: str) -> int:
    """Rank distance between neighbouring members of a ``kind`` group (1 for TP).

    Axes of degree 1 are skipped: an expert-gradient group (``edp_cp``) steps
    by ``etp * ep``, an expert-parallel group by ``etp``.
    """
    if kind == EMBEDDING_GROUP:
        return (plan.pp - 1) * (plan.gpus // plan.pp)
    stride = 1
    axes = GROUP_AXES[kind]
    degrees = axis_degrees(plan)
    for axis in _order(axes):
        if axis in axes and degrees[axis] > 1:
            return stride
        stride *= degrees[axis]
    return stride
