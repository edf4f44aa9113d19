"""Shard a model by a plan into per-stage workloads (the symmetric view).

All ranks of one pipeline stage run the same program, so a workload is one
:class:`StageWork` per stage, built from the compiled blocks: how many of each
block the stage's chunks hold, and every block's evaluated costs. Costs here
are per rank and per iteration unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from stageopt.graph.block import arch_of
from stageopt.graph.compile import CompiledBlock, compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.model.layer_types import block_kinds, chunk_layer_kinds, mtp_layer_kind
from stageopt.model.spec import ModelSpec
from stageopt.parallel.feasibility import model_stages, validate_plan
from stageopt.parallel.placement import BIDIRECTIONAL, rank_chunks
from stageopt.parallel.plan import Plan


@dataclass(frozen=True)
class Chunk:
    """One model chunk held by a stage: which blocks, how many of each.

    ``virtual`` is the chunk's model stage (its position in the pipeline of
    its model copy); ``copy`` is 1 for DualPipe's second model copy.
    """

    stage: int
    local: int  # chunk index on its stage
    virtual: int  # position in the model pipeline
    blocks: dict[str, int]  # block kind -> count
    copy: int = 0
    layers: tuple[str, ...] = ()  # decoder layer kinds in model order, then MTP parts (embedding and head apart)


@dataclass
class Workload:
    model: ModelSpec
    plan: Plan
    chunks: list[list[Chunk]]  # per stage
    blocks: dict[str, CompiledBlock]
    values: dict[str, dict[str, object]] = field(repr=False)

    @property
    def stages(self) -> int:
        return self.plan.pp

    def value(self, kind: str, name: str) -> float:
        return float(self.values[kind][name])

    def chunk_sum(self, chunk: Chunk, name: str) -> float:
        return sum(n * self.value(kind, name) for kind, n in chunk.blocks.items())

    def stage_sum(self, stage: int, name: str) -> float:
        return sum(self.chunk_sum(c, name) for c in self.chunks[stage])

    def message_bytes(self, chunk: Chunk) -> int:
        """Bytes of one pipeline message out of ``chunk`` (a 1/tp shard under scatter-gather)."""
        boundary = self.value("embedding", "boundary_bytes")  # the residual stream crosses every boundary
        return round(boundary / self.plan.tp if self.plan.p2p_scatter_gather else boundary)

    def runs(self, chunk: Chunk) -> int:
        """Micro-batches that pass through a chunk per iteration, over all its flushes (DualPipe feeds each copy
        half of them)."""
        m = self.plan.microbatches * self.plan.flushes
        return m // 2 if self.plan.schedule in BIDIRECTIONAL else m

    def iteration_sum(self, stage: int, name: str) -> float:
        """``name`` summed over the stage's chunks, times the micro-batches each one runs."""
        return sum(self.runs(c) * self.chunk_sum(c, name) for c in self.chunks[stage])

    def _model_sum(self, name: str) -> float:
        """``name`` over one model copy (DualPipe holds two)."""
        return sum(self.chunk_sum(c, name) for row in self.chunks for c in row if c.copy == 0)

    @cached_property
    def params_total(self) -> float:
        return self._model_sum("params_dense") + self._model_sum("params_expert")

    @cached_property
    def params_active(self) -> float:
        experts = self.model.experts or 1
        topk = self.model.top_k or 1
        return self._model_sum("params_dense") + self._model_sum("params_expert") * topk / experts


def layer_counts(model: ModelSpec, plan: Plan) -> list[int]:
    """Decoder layers per model stage of one copy (see :mod:`stageopt.parallel.pipeline_split`)."""
    return [st.layers for st in model_stages(plan, model.layers, model.mtp_layers)]


def build_workload(model: ModelSpec, plan: Plan, gpus: int | None = None) -> Workload:
    """Validate the plan, compile the model's blocks and lay them out over stages."""
    validate_plan(plan, model, gpus)
    arch = arch_of(model, plan)
    partial = plan.recomputed_per_chunk
    blocks = {k: compile_block(k, arch, plan.recompute) for k in block_kinds(model, with_stored=partial is not None)}
    sym = symbol_values(model, plan)
    values = {k: b.evaluate(sym) for k, b in blocks.items()}
    split = model_stages(plan, model.layers, model.mtp_layers)
    first_layer = [sum(st.layers for st in split[:k]) for k in range(len(split))]
    chunks: list[list[Chunk]] = []
    for stage in range(plan.pp):
        row = []
        for place in rank_chunks(plan.schedule, plan.pp, plan.vpp, stage):
            k = place.model_stage
            order = chunk_layer_kinds(model, first_layer[k], split[k].layers, partial)
            order += ("mtp", mtp_layer_kind(model), "mtp_head") * split[k].mtp
            row.append(Chunk(stage, place.local, k, chunk_blocks_of(model, split[k], first_layer[k], partial),
                             place.copy, order))
        chunks.append(row)
    return Workload(model=model, plan=plan, chunks=chunks, blocks=blocks, values=values)


def chunk_blocks_of(model: ModelSpec, stage, start: int, recomputed: int | None = None) -> dict[str, int]:
    """Block counts of a model stage holding ``stage.layers`` decoder layers from layer ``start`` on
    (``recomputed``: partial full recompute re-runs only that many of them, the rest are stored kinds)."""
    blocks = {"embedding": int(stage.embedding)}
    for kind in chunk_layer_kinds(model, start, stage.layers, recomputed):
        blocks[kind] = blocks.get(kind, 0) + 1
    if stage.mtp:
        blocks["mtp"] = stage.mtp
        blocks[mtp_layer_kind(model)] = blocks.get(mtp_layer_kind(model), 0) + stage.mtp
        blocks["mtp_head"] = stage.mtp
    blocks["head"] = int(stage.loss)
    return {k: v for k, v in blocks.items() if v}
