"""Build the program one rank of a pipeline stage runs in one iteration.

The schedule (:func:`stageopt.parallel.schedule.stage_order`) is encoded in
the dependencies, so every simulator runs the same order:

* **Compute is one stream.** Every compute node has a control dependency on the
  previous one, in schedule order: F steps run the chunk's blocks' forward
  ops; B steps run, block by block in reverse, the recompute ops and then the
  backward ops. Collectives hang off the compute they depend on by data
  dependencies (from the graph's tensor producers), so a collective whose
  result is not needed yet (e.g. a TP reduce of an input gradient while weight
  gradients are computed) overlaps later compute.
* **Pipeline messages.** A chunk's F step starts with a receive of the
  previous virtual stage's activations (except virtual stage 0) and ends with a
  send to the next; B steps mirror it with gradients. A receive is posted when
  the compute before it is done. Tags are deterministic and rank-independent:
  ``2 * (microbatch * (chunks - 1) + boundary) + direction``.
* **Data-parallel gradient sync once per iteration** (ZeRO 0-2), in buckets
  issued after the last backward that produces their gradients and overlapping
  the backward that remains. ``bucket``: ``layer`` (one bucket per block, like
  DDP's size-capped buckets at layer granularity; the default), ``chunk`` (one
  per model chunk) or ``stage`` (one after the last backward; also what
  ``dp_overlap=off`` gives). A bucket holds: the TP all-reduce of
  sequence-parallel norm gradients, then the DP all-reduce (ZeRO 0) or
  reduce-scatter (ZeRO 1-2) of dense gradients on ``dp_cp`` and expert
  gradients on ``edp_cp``. ZeRO 1-2 all-gather the updated parameters per
  bucket after the optimizer.
* **ZeRO-3** gathers each block's parameters before its forward and again
  before its backward (prefetched while the previous block computes) and
  reduce-scatters its gradients after its backward, every micro-batch.
* **Optimizer**: one compute node after every gradient reduction.
* **Kernels without FLOPs are not written** (the embedding gather): ASTRA-sim's
  roofline cannot time them (``num_ops`` 0 divides 0 by 0; ``tensor_size`` 0
  marks the node invalid, and its children then wait for an unrelated node to
  finish, which can stall the rank). Their outputs stand for their inputs.

The byte totals per (group, collective) and the FLOPs equal
:mod:`stageopt.workload.stats`'s numbers; bucketing changes counts, not totals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stageopt.errors import ConfigError
from stageopt.graph.block import arch_of
from stageopt.graph.symbols import symbol_values
from stageopt.parallel.ranks import group_size
from stageopt.parallel.schedule import Step, stage_order
from stageopt.program.block_ops import BlockOps, OpShape, block_ops
from stageopt.program.nodes import COLL, COMP, NEXT, PREV, RECV, SEND, ProgramNode, StageProgram
from stageopt.program.params import BlockParams, block_params, ceil_div
from stageopt.workload import Chunk, Workload
from stageopt.workload.memory import shard_degrees, stage_params
from stageopt.workload.stats import OPTIMIZER_FLOPS_PER_PARAM

BUCKETS = ("layer", "chunk", "stage")
MAX_TAG = 500_000_000  # ASTRA-sim numbers its collective streams from here; message tags stay below
OPTIMIZER_STATE_BYTES = 24  # fp32 master weight, Adam m and v: each read and written (3 x 4 x 2)
DP_GROUPS = ("dp_cp", "edp_cp")
BLOCK_ORDER = ("embedding", "dense", "moe", "head")


@dataclass(frozen=True)
class ProgramOptions:
    """Choices that change the trace but not the totals; ``bucket`` None is the framework's."""

    bucket: str | None = None

    def __post_init__(self) -> None:
        if self.bucket is not None and self.bucket not in BUCKETS:
            raise ConfigError(f"dp bucket '{self.bucket}' is unknown; use one of {', '.join(BUCKETS)}")


@dataclass
class _Emitted:
    """What one block's ops in one step left behind for the next block and for gradient sync."""

    exits: tuple[int, ...]
    done: tuple[int, ...]  # last compute node plus collectives nothing in the block waits for


@dataclass
class _Bucket:
    params: BlockParams
    name: str
    deps: list[int] = field(default_factory=list)


class _Builder:
    """Appends nodes with contiguous ids and keeps the compute stream in order."""

    def __init__(self) -> None:
        self.nodes: list[ProgramNode] = []
        self.last_comp: int | None = None

    def add(self, name: str, type_: str, phase: str, data: list[int] | tuple[int, ...] = (),
            ctrl: tuple[int, ...] = (), **fields: object) -> int:
        nid = len(self.nodes)
        data_deps = tuple(sorted(set(data))) if len(data) > 1 else tuple(data)
        if len(ctrl) == 1:  # the common case: the previous compute node
            ctrl_deps = () if ctrl[0] in data_deps else tuple(ctrl)
        else:
            ctrl_deps = tuple(sorted(set(ctrl).difference(data_deps)))
        self.nodes.append(ProgramNode(nid, name, type_, phase, data_deps, ctrl_deps, **fields))  # type: ignore[arg-type]
        return nid

    def comp(self, name: str, phase: str, data: list[int], num_ops: int, tensor_size: int, kernel: str = "",
             gemm: tuple[int, int, int, int] = (0, 0, 0, 0), precision: int = 0, launches: int = 1) -> int:
        ctrl = () if self.last_comp is None else (self.last_comp,)
        nid = self.add(name, COMP, phase, data, ctrl, num_ops=num_ops, tensor_size=tensor_size, kernel=kernel,
                       gemm=gemm, precision=precision, launches=launches)
        self.last_comp = nid
        return nid

    def stream_point(self) -> tuple[int, ...]:
        return () if self.last_comp is None else (self.last_comp,)


class _StageBuilder:
    def __init__(self, work: Workload, stage: int, options: ProgramOptions) -> None:
        self.work, self.plan, self.stage = work, work.plan, stage
        bucket = (options.bucket if options and options.bucket else self.plan.framework.dp_bucket)
        self.options = ProgramOptions(bucket=bucket if self.plan.dp_overlap else "stage")
        arch = arch_of(work.model, self.plan)
        sym = symbol_values(work.model, self.plan)
        kinds = {k for c in work.chunks[stage] for k in c.blocks}
        self.ops: dict[str, BlockOps] = {k: block_ops(k, arch, self.plan.recompute) for k in kinds}
        self.vals: dict[str, list[int]] = {k: b.evaluate(sym).tolist() for k, b in self.ops.items()}  # plain ints: hot loop
        self.params = {k: block_params(work, k) for k in kinds}
        self.sizes = {g: group_size(self.plan, g) for g in ("tp", "cp", "ep", *DP_GROUPS)}
        self.b = _Builder()
        self.n_virtual = self.plan.pp * self.plan.vpp
        self.boundary = {c.local: work.message_bytes(c) for c in work.chunks[stage]}
        self.pending: _Bucket | None = None  # gradients queued for the next DP bucket
        self.issued: list[_Bucket] = []
        self.reductions: list[int] = []  # gradient reductions the optimizer waits for

    # -- blocks ----------------------------------------------------------------
    def block(self, kind: str, ops: tuple[OpShape, ...], exits: tuple[int, ...], entry: tuple[int, ...],
              label: str, weights: dict[str, int]) -> _Emitted:
        vals, b, sizes = self.vals[kind], self.b, self.sizes
        produced: dict[int, tuple[int, ...]] = {}
        waited: set[int] = set()
        colls: list[int] = []
        node_at: dict[int, int] = {}  # position in ops -> node id
        for pos, op in enumerate(ops):
            deps: list[int] = []
            external = False
            for uid in op.inputs:
                src = produced.get(uid)
                if src is None:
                    external = True
                else:
                    deps.extend(src)
            if external:
                deps.extend(entry)
            if op.kind == "alias" or (op.kind == COLL and sizes[op.axis] == 1) or (op.kind == COMP
                                                                            and not vals[op.values]):
                for uid in op.outputs:
                    produced[uid] = tuple(deps)
                continue
            if op.weight_groups and weights:
                deps.extend(weights[g] for g in op.weight_groups if g in weights)
            waited.update(deps)
            name = f"{label}:{op.name}"
            if op.kind == COMP:
                at = op.values
                nid = b.comp(name, op.phase, deps, vals[at], vals[at + 1], op.kernel,
                             tuple(int(v) for v in vals[at + 2:at + 6]), op.precision, op.launches)
            else:
                nid = b.add(name, COLL, op.phase, deps, collective=op.collective, comm_size=vals[op.values],
                            group=op.axis, group_size=sizes[op.axis])
                colls.append(nid)
            node_at[pos] = nid
            for uid in op.outputs:
                produced[uid] = (nid,)
        for pos, op in enumerate(ops):
            if op.hides and pos in node_at:
                nid = node_at[pos]
                b.nodes[nid] = dataclasses.replace(b.nodes[nid], overlap=tuple(node_at[h] for h in op.hides
                                                                              if h in node_at))
        found = tuple(sorted({n for uid in exits for n in produced.get(uid, ())}))
        last = b.stream_point()
        return _Emitted(exits=found or last, done=last + tuple(c for c in colls if c not in waited))

    def zero3_gathers(self, kind: str, deps: tuple[int, ...], label: str) -> dict[str, int]:
        """ZeRO-3: gather this block's parameters (per group) once ``deps`` are done (prefetch)."""
        if self.plan.zero < 3:
            return {}
        out: dict[str, int] = {}
        for group, pgroup in zip(DP_GROUPS, ("dense", "expert")):
            size, params = self.sizes[group], self.params[kind].of_group(group)
            if size > 1 and params:
                out[pgroup] = self.b.add(f"{label}:zero3_gather_{pgroup}", COLL, "zero3", deps,
                                         collective="all_gather", group=group, group_size=size,
                                         comm_size=ceil_div(params * self.plan.dtype_bytes, size))
        return out

    def zero3_scatters(self, kind: str, deps: tuple[int, ...], label: str) -> None:
        if self.plan.zero < 3:
            return
        for group in DP_GROUPS:
            size, params = self.sizes[group], self.params[kind].of_group(group)
            if size > 1 and params:
                self.reductions.append(self.b.add(
                    f"{label}:zero3_scatter_{group}", COLL, "zero3", deps, collective="reduce_scatter",
                    group=group, group_size=size, comm_size=params * self.plan.grad_bytes))

    # -- steps -----------------------------------------------------------------
    def message(self, send: bool, peer: str, mb: int, boundary: int, direction: int, size: int,
                deps: tuple[int, ...], label: str) -> int:
        tag = 2 * (mb * (self.n_virtual - 1) + boundary) + direction
        if tag >= MAX_TAG:
            raise ConfigError(f"pipeline message tag {tag} exceeds {MAX_TAG}: too many micro-batches x chunks "
                              f"({self.plan.microbatches} x {self.n_virtual}); lower gbs or vpp")
        if send:
            return self.b.add(f"{label}:send", SEND, "p2p", deps, comm_size=size, peer=peer, tag=tag)
        return self.b.add(f"{label}:recv", RECV, "p2p", (), deps, comm_size=size, peer=peer, tag=tag)

    def forward(self, step: Step, chunk: Chunk) -> None:
        v, last = chunk.virtual, self.n_virtual - 1
        label = f"F{step.microbatch}.{step.chunk}"
        entry = self.b.stream_point()
        if v > 0:
            entry = (self.message(False, PREV, step.microbatch, v - 1, 0, self.boundary[chunk.local], entry, label),)
        prefetch = entry
        for i, kind in enumerate(chunk_blocks(chunk)):
            blabel = f"{label}.{i}"
            weights = self.zero3_gathers(kind, prefetch, blabel)
            prefetch = entry
            ops = self.ops[kind]
            entry = self.block(kind, ops.forward, ops.forward_exits, entry, blabel, weights).exits
        if v < last:
            self.message(True, NEXT, step.microbatch, v, 0, self.boundary[chunk.local], entry, label)

    def backward(self, step: Step, chunk: Chunk, last_b: bool) -> None:
        v, last = chunk.virtual, self.n_virtual - 1
        label = f"B{step.microbatch}.{step.chunk}"
        entry = self.b.stream_point()
        if v < last:
            entry = (self.message(False, NEXT, step.microbatch, v, 1, self.boundary[chunk.local], entry, label),)
        prefetch = entry
        kinds = chunk_blocks(chunk)
        for i in reversed(range(len(kinds))):
            kind, blabel = kinds[i], f"{label}.{i}"
            weights = self.zero3_gathers(kind, prefetch, blabel)
            prefetch = entry
            ops = self.ops[kind]
            res = self.block(kind, ops.backward, ops.backward_exits, entry, blabel, weights)
            self.zero3_scatters(kind, res.done, blabel)
            entry = res.exits
            if last_b:
                self.bucket_block(kind, f"{chunk.local}.{i}", res.done)
        if v > 0:
            self.message(True, PREV, step.microbatch, v - 1, 1, self.boundary[chunk.local], entry, label)
        if last_b and self.options.bucket == "chunk":
            self.flush_bucket()

    # -- gradient sync -----------------------------------------------------------
    def bucket_block(self, kind: str, where: str, done: tuple[int, ...]) -> None:
        """Add a block's gradients to the open bucket; per-layer buckets are issued at once."""
        p = self.params[kind]
        if self.pending is None:
            self.pending = _Bucket(p, f"dp{where}")
        else:
            q = self.pending.params
            self.pending.params = BlockParams(q.dense + p.dense, q.expert + p.expert, q.tp_partial + p.tp_partial)
        self.pending.deps.extend(done)
        if self.options.bucket == "layer":
            self.flush_bucket()

    def flush_bucket(self) -> None:
        """Issue the open bucket once everything that produces its gradients is done."""
        if self.pending is not None:
            self.issue_bucket(self.pending, tuple(sorted(set(self.pending.deps))))
            self.issued.append(self.pending)
            self.pending = None

    def issue_bucket(self, bucket: _Bucket, deps: tuple[int, ...]) -> None:
        plan, p = self.plan, bucket.params
        if p.tp_partial and self.sizes["tp"] > 1:
            deps = (self.b.add(f"{bucket.name}:tp_norm_grads", COLL, "dp", deps, collective="all_reduce",
                               group="tp", group_size=self.sizes["tp"], comm_size=p.tp_partial * plan.grad_bytes),)
            self.reductions.append(deps[0])
        if plan.zero >= 3:
            return
        kind = "all_reduce" if plan.zero == 0 else "reduce_scatter"
        for group in DP_GROUPS:
            size, params = self.sizes[group], p.of_group(group)
            if size > 1 and params:
                self.reductions.append(self.b.add(f"{bucket.name}:{kind}_{group}", COLL, "dp", deps,
                                                  collective=kind, group=group, group_size=size,
                                                  comm_size=params * plan.grad_bytes))

    def finish(self) -> None:
        """Remaining buckets, the optimizer step, then ZeRO 1-2 parameter gathers."""
        if self.pending is not None:
            self.pending.deps.extend(self.b.stream_point())
            self.flush_bucket()
        plan = self.plan
        dense, expert = stage_params(self.work, self.stage)
        dense_shard, expert_shard = shard_degrees(self.work)
        updated = dense / dense_shard + expert / expert_shard if plan.zero >= 1 else dense + expert
        flops = round(OPTIMIZER_FLOPS_PER_PARAM * updated)
        touched = round(updated * (plan.grad_bytes + OPTIMIZER_STATE_BYTES + plan.dtype_bytes))
        opt = self.b.comp("optimizer", "optimizer", list(self.reductions), flops, touched, "vector")
        if plan.zero not in (1, 2):
            return
        for bucket in self.issued:
            for group in DP_GROUPS:
                size, params = self.sizes[group], bucket.params.of_group(group)
                if size > 1 and params:
                    self.b.add(f"{bucket.name}:all_gather_{group}", COLL, "dp", (opt,), collective="all_gather",
                               group=group, group_size=size, comm_size=ceil_div(params * plan.dtype_bytes, size))

    def build(self) -> StageProgram:
        order = stage_order(self.plan, self.stage)
        last_b = {s.chunk: i for i, s in enumerate(order) if s.kind == "B"}
        chunks = self.work.chunks[self.stage]
        for i, step in enumerate(order):
            if step.kind == "F":
                self.forward(step, chunks[step.chunk])
            else:
                self.backward(step, chunks[step.chunk], last_b[step.chunk] == i)
        self.finish()
        return StageProgram(stage=self.stage, nodes=tuple(self.b.nodes))


def chunk_blocks(chunk: Chunk) -> list[str]:
    """The chunk's blocks in model order: embedding, dense layers, MoE layers, head."""
    return [k for k in BLOCK_ORDER for _ in range(chunk.blocks.get(k, 0))]


def build_stage_program(work: Workload, stage: int, options: ProgramOptions | None = None) -> StageProgram:
    """The program every rank of pipeline stage ``stage`` runs (see the module docstring)."""
    return _StageBuilder(work, stage, options or ProgramOptions()).build()


def build_programs(work: Workload, options: ProgramOptions | None = None) -> list[StageProgram]:
    return [build_stage_program(work, s, options) for s in range(work.stages)]
