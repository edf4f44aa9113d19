"""Build the program one rank of a pipeline stage runs in one iteration.

The schedule (:func:`stageopt.parallel.schedule.stage_order`) is encoded in
the dependencies, so every simulator runs the same order:

* **Compute is one stream.** Every compute node has a control dependency on the
  previous one, in schedule order: F steps run the chunk's blocks' forward
  ops; B steps run, block by block in reverse, the recompute ops and then the
  backward ops. Zero-bubble schedules split B into an I step (recompute and
  the input-gradient ops) and a W step (the weight-gradient ops,
  :func:`stageopt.graph.block.weight_gradient_ops`), whose inputs are data
  dependencies on the I step. A paired step (DualPipe's overlapped forward and
  backward chunks) forks the stream: both chunks start after the previous
  step and the next step waits for both, so a simulator runs one chunk's
  kernels while the other waits for its all-to-all. Collectives hang off the compute they depend on by data
  dependencies (from the graph's tensor producers), so a collective whose
  result is not needed yet (e.g. a TP reduce of an input gradient while weight
  gradients are computed) overlaps later compute.
* **Pipeline messages.** A chunk's F step starts with a receive of the
  previous model stage's activations (except model stage 0) and ends with a
  send to the next; B and I steps mirror it with gradients. Peers follow the
  placement (:mod:`stageopt.parallel.placement`): the next or previous rank,
  or none where a V-shaped schedule turns on the same rank (the handoff is a
  data dependency). A receive is posted when the compute before it is done.
  Tags are deterministic and rank-independent:
  ``2 * (microbatch * (model stages - 1) + boundary) + direction``.
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
  before its backward (prefetched while the previous block computes, or, on a
  stack without ``zero3_prefetch``, after it and its scatter finish) and
  reduce-scatters its gradients after its backward, every micro-batch.
* **Activation offloading** (``offload_layers``, pp 1): after each of the
  first N layers' forward its saved tensors are copied to host memory on the
  copy engine, and the forward two layers on waits for that copy; in backward
  the copy back of layer i-1 starts with layer i's backward, and layer i-1
  waits for it (Transformer Engine's offload handler).
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
from dataclasses import dataclass

from stageopt.errors import ConfigError
from stageopt.graph.block import arch_of
from stageopt.graph.compile import saved_bytes_key
from stageopt.graph.fusion import group_label
from stageopt.graph.symbols import symbol_values
from stageopt.model.layer_types import is_layer
from stageopt.parallel.placement import model_stage_count, neighbour, rank_chunks
from stageopt.parallel.ranks import dense_dp_groups, expert_dp_group, group_size
from stageopt.parallel.schedule import Step, stage_order
from stageopt.program.block_ops import BlockOps, OpShape, block_ops
from stageopt.program.grad_sync import Bucket, GradSync
from stageopt.program.nodes import COLL, COMP, COPY, NEXT, PREV, RECV, SEND, ProgramNode, StageProgram
from stageopt.program.params import block_params
from stageopt.workload import Chunk, Workload

BUCKETS = ("layer", "chunk", "stage")
MAX_TAG = 500_000_000  # ASTRA-sim numbers its collective streams from here; message tags stay below
_PEER = {"next": NEXT, "prev": PREV}


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
    produced: dict[int, tuple[int, ...]]  # tensor uid -> the nodes standing for it (read by a later W step)


class _Builder:
    """Appends nodes with contiguous ids and keeps the compute stream in order (``stream``: its tail)."""

    def __init__(self) -> None:
        self.nodes: list[ProgramNode] = []
        self.stream: tuple[int, ...] = ()

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
             gemm: tuple[int, ...] = (0, 0, 0, 0, 0), precision: int = 0, launches: int = 1,
             wgrad: bool = False) -> int:
        nid = self.add(name, COMP, phase, data, self.stream, num_ops=num_ops, tensor_size=tensor_size, kernel=kernel,
                       gemm=gemm, precision=precision, launches=launches, wgrad=wgrad)
        self.stream = (nid,)
        return nid

    def stream_point(self) -> tuple[int, ...]:
        return self.stream


class _StageBuilder(GradSync):
    def __init__(self, work: Workload, stage: int, options: ProgramOptions) -> None:
        self.work, self.plan, self.stage = work, work.plan, stage
        bucket = (options.bucket if options and options.bucket else self.plan.framework.dp_bucket)
        self.options = ProgramOptions(bucket=bucket if self.plan.dp_overlap else "stage")
        self.zero3_prefetch = self.plan.framework.zero3_prefetch  # else each gather waits for the block before
        arch = arch_of(work.model, self.plan)
        sym = symbol_values(work.model, self.plan)
        kinds = {k for c in work.chunks[stage] for k in c.blocks}
        self.ops: dict[str, BlockOps] = {k: block_ops(k, arch, self.plan.recompute) for k in kinds}
        self.vals: dict[str, list[int]] = {k: b.evaluate(sym).tolist() for k, b in self.ops.items()}  # plain ints: hot loop
        self.params = {k: block_params(work, k) for k in kinds}
        shard_group, replicas = dense_dp_groups(self.plan)
        self.dp_groups = (shard_group, expert_dp_group(self.plan))  # dense then expert gradients (GradSync)
        self.replicas = replicas
        kinds_used = ("tp", "cp", "ep", "cpa", *self.dp_groups, *([replicas] if replicas else []))
        self.sizes = {g: group_size(self.plan, g) for g in kinds_used}
        self.b = _Builder()
        plan = self.plan
        self.n_model = model_stage_count(plan.schedule, plan.pp, plan.vpp)
        self.places = rank_chunks(plan.schedule, plan.pp, plan.vpp, stage)
        self.boundary = work.message_bytes(work.chunks[stage][0])  # the residual stream (1/tp with scatter-gather)
        self.handoff: dict[tuple, tuple[int, ...]] = {}  # (kind, copy, model stage, mb) -> exits, same-rank turns
        self.w_inputs: dict[tuple[int, int, int], dict[int, tuple[int, ...]]] = {}  # (mb, chunk, block) -> I outputs
        self.pending: Bucket | None = None  # gradients queued for the next DP bucket
        self.issued: list[Bucket] = []
        self.reductions: list[int] = []  # gradient reductions the optimizer waits for

    # -- blocks ----------------------------------------------------------------
    def block(self, kind: str, ops: tuple[OpShape, ...], exits: tuple[int, ...], entry: tuple[int, ...],
              label: str, weights: dict[str, int], known: dict[int, tuple[int, ...]] | None = None,
              wgrad: bool | None = None) -> _Emitted:
        """Emit a block's ops; ``wgrad`` True/False keeps only the W or only the non-W ops of a backward."""
        vals, b, sizes = self.vals[kind], self.b, self.sizes
        produced: dict[int, tuple[int, ...]] = dict(known or {})
        waited: set[int] = set()
        colls: list[int] = []
        node_at: dict[int, int] = {}  # position in ops -> node id
        for pos, op in enumerate(ops):
            if wgrad is not None and op.wgrad != wgrad:
                continue
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
                             tuple(int(v) for v in vals[at + 2:at + 7]), op.precision, int(vals[at + 7]), op.wgrad)
            else:
                nid = b.add(name, COLL, op.phase, deps, collective=op.collective, comm_size=vals[op.values],
                            group=op.axis, group_size=sizes[op.axis])
                colls.append(nid)
            node_at[pos] = nid
            for uid in op.outputs:
                produced[uid] = (nid,)
        for pos, op in enumerate(ops):
            if (op.hides or op.async_hides) and pos in node_at:
                nid = node_at[pos]
                b.nodes[nid] = dataclasses.replace(
                    b.nodes[nid], overlap=tuple(node_at[h] for h in op.hides if h in node_at),
                    async_overlap=tuple(node_at[h] for h in op.async_hides if h in node_at))
            if op.group >= 0 and pos in node_at and op.group // 4 in node_at:
                nid = node_at[pos]
                label = group_label(node_at[op.group // 4], op.group % 4)
                b.nodes[nid] = dataclasses.replace(b.nodes[nid], gemm_group=label)
        found = tuple(sorted({n for uid in exits for n in produced.get(uid, ())}))
        last = b.stream_point()
        return _Emitted(exits=found or last, done=last + tuple(c for c in colls if c not in waited),
                        produced=produced)

    # -- messages ----------------------------------------------------------------
    def message(self, send: bool, peer: str, mb: int, boundary: int, direction: int,
                deps: tuple[int, ...], label: str) -> int:
        tag = 2 * (mb * (self.n_model - 1) + boundary) + direction
        if tag >= MAX_TAG:
            raise ConfigError(f"pipeline message tag {tag} exceeds {MAX_TAG}: too many micro-batches x chunks "
                              f"({self.plan.microbatches} x {self.n_model}); lower gbs or vpp")
        if send:
            return self.b.add(f"{label}:send", SEND, "p2p", deps, comm_size=self.boundary, peer=_PEER[peer], tag=tag)
        return self.b.add(f"{label}:recv", RECV, "p2p", (), deps, comm_size=self.boundary, peer=_PEER[peer], tag=tag)

    def receive(self, step: Step, chunk: Chunk, direction: int, label: str) -> tuple[int, ...]:
        """The step's entry: a receive from the neighbour rank, the same rank's handoff, or the stream."""
        place = self.places[chunk.local]
        src = neighbour(self.plan.schedule, self.plan.pp, self.n_model, place, -1 if direction == 0 else 1)
        entry = self.b.stream_point()
        k = chunk.virtual
        if src == "self":
            return entry + self.handoff.pop(("F" if direction == 0 else "B", chunk.copy,
                                             k + (-1 if direction == 0 else 1), step.microbatch))
        if src:
            boundary = k - 1 if direction == 0 else k
            return (self.message(False, src, step.microbatch, boundary, direction, entry, label),)
        return entry

    def deliver(self, step: Step, chunk: Chunk, direction: int, exits: tuple[int, ...], label: str) -> None:
        place = self.places[chunk.local]
        dst = neighbour(self.plan.schedule, self.plan.pp, self.n_model, place, 1 if direction == 0 else -1)
        k = chunk.virtual
        if dst == "self":
            self.handoff[("F" if direction == 0 else "B", chunk.copy, k, step.microbatch)] = exits
        elif dst:
            self.message(True, dst, step.microbatch, k if direction == 0 else k - 1, direction, exits, label)

    # -- steps -----------------------------------------------------------------
    def forward(self, step: Step, chunk: Chunk) -> None:
        label = f"F{step.microbatch}.{step.chunk}"
        entry = self.receive(step, chunk, 0, label)
        prefetch = entry
        kinds = chunk_blocks(chunk)
        offloaded = self.offloaded_blocks(kinds)
        copies: dict[int, int] = {}  # block -> its offload copy, which the block two on waits for
        for i, kind in enumerate(kinds):
            blabel = f"{label}.{i}"
            weights = self.zero3_gathers(kind, prefetch if self.zero3_prefetch else entry, blabel)
            prefetch = entry
            ops = self.ops[kind]
            wait = (copies.pop(i - 2),) if i - 2 in copies else ()
            entry = self.block(kind, ops.forward, ops.forward_exits, entry + wait, blabel, weights).exits
            if i in offloaded:
                copies[i] = self.host_copy(kind, f"{blabel}:offload", "offload")
        self.deliver(step, chunk, 0, entry, label)

    def backward(self, step: Step, chunk: Chunk, last_grad: bool) -> None:
        """A full backward (B) or its input-gradient part (I): walks the chunk's blocks in reverse."""
        label = f"{step.kind}{step.microbatch}.{step.chunk}"
        entry = self.receive(step, chunk, 1, label)
        prefetch = entry
        kinds = chunk_blocks(chunk)
        split = step.kind == "I"
        synced: tuple[int, ...] = ()  # without prefetch: the previous block's scatters, which the gather waits for
        offloaded = self.offloaded_blocks(kinds)
        reloads: dict[int, int] = {}  # block -> the copy back of its saved tensors, started one block ahead
        for i in reversed(range(len(kinds))):
            kind, blabel = kinds[i], f"{label}.{i}"
            weights = self.zero3_gathers(kind, prefetch if self.zero3_prefetch else entry + synced, blabel)
            prefetch = entry
            ops = self.ops[kind]
            if i - 1 in offloaded:
                reloads[i - 1] = self.host_copy(kinds[i - 1], f"{label}.{i - 1}:reload", "reload")
            wait = (reloads.pop(i),) if i in reloads else ()
            res = self.block(kind, ops.backward, ops.backward_exits, entry + wait, blabel, weights,
                             wgrad=False if split else None)
            entry = res.exits
            if split:
                self.w_inputs[(step.microbatch, step.chunk, i)] = res.produced
            else:
                synced = self.block_done(kind, chunk, i, res.done, blabel, last_grad)
        self.deliver(step, chunk, 1, entry, label)
        if last_grad and not split and self.options.bucket == "chunk":
            self.flush_bucket()

    def weights_step(self, step: Step, chunk: Chunk, last_grad: bool) -> None:
        """The weight-gradient part (W) of an earlier I step, block by block in reverse."""
        label = f"W{step.microbatch}.{step.chunk}"
        entry = self.b.stream_point()
        kinds = chunk_blocks(chunk)
        for i in reversed(range(len(kinds))):
            kind, blabel = kinds[i], f"{label}.{i}"
            ops = self.ops[kind]
            known = self.w_inputs.pop((step.microbatch, step.chunk, i))
            res = self.block(kind, ops.backward, (), entry, blabel, {}, known, wgrad=True)
            self.block_done(kind, chunk, i, res.done, blabel, last_grad)
        if last_grad and self.options.bucket == "chunk":
            self.flush_bucket()

    # -- activation offloading ----------------------------------------------------
    def offloaded_blocks(self, kinds: list[str]) -> set[int]:
        """Positions of the chunk's blocks whose saved tensors go to host memory: its first N layers (pp 1)."""
        layers = [i for i, kind in enumerate(kinds) if is_layer(kind)]
        return set(layers[:self.plan.offload_layers])

    def host_copy(self, kind: str, name: str, phase: str) -> int:
        """A copy of one block's saved tensors to or from host memory, after the compute issued so far."""
        nbytes = int(self.work.value(kind, saved_bytes_key(self.plan)))
        return self.b.add(name, COPY, phase, self.b.stream_point(), comm_size=nbytes)

    def block_done(self, kind: str, chunk: Chunk, i: int, done: tuple[int, ...], label: str,
                   last_grad: bool) -> tuple[int, ...]:
        """A block's gradients are complete for this micro-batch: ZeRO-3 scatter (its node ids returned),
        DP bucket after the last. A stack that stages its gradients (DeepSpeed's fp32 copies, FSDP's cast and
        pre-divide) does so first."""
        staged = self.plan.grad_staging_bytes
        params = staged and self.work.value(kind, "local_dense") + self.work.value(kind, "local_expert")
        if params > 0:
            done = (self.b.comp(f"{label}:grad_staging", "bwd", list(done), 0, round(staged * params), "vector"),)
        scatters = self.zero3_scatters(kind, done, label)
        if last_grad:
            self.bucket_block(kind, f"{chunk.local}.{i}", done)
        return scatters

    def run(self, step: Step, last_grad: bool) -> None:
        chunk = self.work.chunks[self.stage][step.chunk]
        if step.kind == "F":
            self.forward(step, chunk)
        elif step.kind == "W":
            self.weights_step(step, chunk, last_grad)
        else:
            self.backward(step, chunk, last_grad)

    def build(self) -> StageProgram:
        order = stage_order(self.plan, self.stage)
        last_grad = {s.chunk: i for i, s in enumerate(order) if s.kind in ("B", "W")}
        i = 0
        while i < len(order):
            if order[i].paired:  # fork the stream: both chunks start now, the next step waits for both
                base = self.b.stream_point()
                self.run(order[i], last_grad[order[i].chunk] == i)
                first_end = self.b.stream_point()
                self.b.stream = base
                self.run(order[i + 1], last_grad[order[i + 1].chunk] == i + 1)
                self.b.stream = tuple(sorted(set(first_end + self.b.stream_point())))
                i += 2
            else:
                self.run(order[i], last_grad[order[i].chunk] == i)
                i += 1
        self.finish()
        return StageProgram(stage=self.stage, nodes=tuple(self.b.nodes))


def chunk_blocks(chunk: Chunk) -> list[str]:
    """The chunk's blocks in model order: embedding, its decoder layers (then MTP modules), head."""
    return ["embedding"] * chunk.blocks.get("embedding", 0) + list(chunk.layers) + ["head"] * chunk.blocks.get("head", 0)


def build_stage_program(work: Workload, stage: int, options: ProgramOptions | None = None) -> StageProgram:
    """The program every rank of pipeline stage ``stage`` runs (see the module docstring)."""
    return _StageBuilder(work, stage, options or ProgramOptions()).build()


def build_programs(work: Workload, options: ProgramOptions | None = None) -> list[StageProgram]:
    return [build_stage_program(work, s, options) for s in range(work.stages)]
