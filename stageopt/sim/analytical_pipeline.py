"""What every pipeline stage holds, for many candidate plans at once: block counts and messages per stage.

Why per stage and not three representatives: uneven splits (Megatron-Core's
first/last stage layer counts, embedding and loss counted as layers, explicit
layouts) and V-shaped or bidirectional placements make stages differ in ways
a first/middle/last summary misses. A plan's table comes from the same split
and placement functions the workload uses (:mod:`stageopt.parallel`), cached
per pipeline shape, so a batch of thousands of plans costs a few table lookups.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from stageopt.model.layer_types import block_kinds
from stageopt.model.spec import ModelSpec
from stageopt.parallel.feasibility import model_stages
from stageopt.parallel.placement import model_stage_count, neighbour, rank_chunks
from stageopt.parallel.plan import Plan
from stageopt.workload.sharding import chunk_blocks_of

# per local chunk: messages after its F and after its B, and whether each goes to the next stage (else the previous)
SEND_COLUMNS = ("send_f", "send_b", "f_next", "b_next")
STAGE_EXTRA = ("sends", "sends_next", "chunks")  # per stage: messages per micro-batch (to the next stage), chunks held


def columns(model: ModelSpec) -> tuple[str, ...]:
    """Per-chunk table columns: the model's block kinds (stored layer variants included), then SEND_COLUMNS."""
    return (*block_kinds(model, with_stored=True), *SEND_COLUMNS)


def pipeline_key(plan: Plan) -> tuple:
    """The plan fields a stage table depends on."""
    return (plan.schedule, plan.pp, plan.vpp, plan.first_layers, plan.last_layers, plan.embed_split,
            plan.loss_split, plan.layout, plan.recomputed_per_chunk)


@lru_cache(maxsize=512)
def _chunk_table(model: ModelSpec, plan: Plan) -> np.ndarray:
    """Shape (stages, chunks per rank, columns(model)): each local chunk's blocks and messages."""
    split = model_stages(plan, model.layers, model.mtp_layers)
    starts = [sum(st.layers for st in split[:k]) for k in range(len(split))]
    n_model = model_stage_count(plan.schedule, plan.pp, plan.vpp)
    places = [rank_chunks(plan.schedule, plan.pp, plan.vpp, stage) for stage in range(plan.pp)]
    kinds = block_kinds(model, with_stored=True)
    rows = np.zeros((plan.pp, len(places[0]), len(kinds) + len(SEND_COLUMNS)))
    for stage, row in enumerate(places):
        for place in row:
            k = place.model_stage
            for kind, count in chunk_blocks_of(model, split[k], starts[k], plan.recomputed_per_chunk).items():
                rows[stage, place.local, kinds.index(kind)] = count
            for col, step in ((-4, 1), (-3, -1)):
                peer = neighbour(plan.schedule, plan.pp, n_model, place, step)
                rows[stage, place.local, col] = peer in ("next", "prev")
                rows[stage, place.local, col + 2] = peer == "next"
    return rows


def _table(model: ModelSpec, plan: Plan) -> np.ndarray:
    """Rows: stages; columns: block kinds, then STAGE_EXTRA (messages per micro-batch, those to the next
    stage, chunks held)."""
    chunks = _chunk_table(model, plan)
    counts = chunks.sum(axis=1)
    send_f, send_b, f_next, b_next = (chunks[:, :, -4 + j] for j in range(4))
    sends = (send_f + send_b).sum(axis=1, keepdims=True)
    to_next = (send_f * f_next + send_b * b_next).sum(axis=1, keepdims=True)
    return np.concatenate([counts[:, :-len(SEND_COLUMNS)], sends, to_next, np.full((plan.pp, 1), chunks.shape[1])],
                          axis=1)


def _canonical(plan: Plan) -> Plan:
    partial = plan.recomputed_per_chunk
    return Plan(pp=plan.pp, vpp=plan.vpp, schedule=plan.schedule, **_split_fields(plan), framework=plan.framework,
                recompute="full" if partial else "none", recompute_layers=partial or 0)


def stage_tables(model: ModelSpec, plans: list[Plan]) -> dict[str, np.ndarray]:
    """Per-stage columns as arrays of shape (plans, max pp); ``valid`` marks stages that exist."""
    width = max(p.pp for p in plans)
    names = (*block_kinds(model, with_stored=True), *STAGE_EXTRA)
    out = np.zeros((len(plans), width, len(names)))
    valid = np.zeros((len(plans), width), dtype=bool)
    by_key: dict[tuple, list[int]] = {}
    for i, plan in enumerate(plans):
        by_key.setdefault(pipeline_key(plan), []).append(i)
    for index in by_key.values():
        plan = plans[index[0]]
        out[index, :plan.pp] = _table(model, _canonical(plan))
        valid[index, :plan.pp] = True
    tables = {name: out[:, :, j] for j, name in enumerate(names)}
    tables["valid"] = valid
    return tables


def chunk_tables(model: ModelSpec, plans: list[Plan]) -> dict[str, np.ndarray]:
    """Per-chunk columns, arrays of shape (plans, pp, chunks per rank); plans must share pp and schedule shape."""
    rows = np.stack([_chunk_table(model, _canonical(p)) for p in plans])
    return {name: rows[..., j] for j, name in enumerate(columns(model))}


def _split_fields(plan: Plan) -> dict[str, object]:
    return {"first_layers": plan.first_layers, "last_layers": plan.last_layers, "embed_split": plan.embed_split,
            "loss_split": plan.loss_split, "layout": plan.layout}


def stage_column(tables: dict[str, np.ndarray], stage: int) -> dict[str, np.ndarray]:
    """One stage's block counts and sends, as the per-stage dict the time and memory models take."""
    return {name: table[:, stage] for name, table in tables.items() if name != "valid"}
