"""One NPU of the ASTRA-sim-compatible engine: workload slots and the system layer.

The workload side issues ready nodes in ascending id order into one GPU, one
CPU and one communication slot; the system side cuts collectives into chunks
(:class:`Stream`) that walk their phases through per-dimension queues, each
phase run by a packet state machine from :mod:`stageopt.astrasim.algorithms`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stageopt.astrasim.algorithms import Ring, make_algorithm
from stageopt.astrasim.collective_timing import PhaseSpec, algos_for, chunking, plan_phases
from stageopt.astrasim.configs import AlgoSpec, CollectiveAlgo, SchedulingPolicy
from stageopt.astrasim.records import (
    COLLECTIVE_TAG_BASE,
    GROUP_STREAM_BASE,
    NATIVE_TAG_BASE,
    TAG_SPAN,
    Op,
    OpKind,
    Slot,
)
from stageopt.chakra import CommType
from stageopt.errors import ConfigError


class DataSet:
    """All chunks of one collective on one rank; finishing the last one finishes the node."""

    __slots__ = ("remaining", "op")

    def __init__(self, chunks: int, op: Op) -> None:
        self.remaining = chunks
        self.op = op


class Stream:
    """One chunk of a collective on one rank, walking its phases through the queues."""

    __slots__ = ("rank", "tag", "priority", "phases", "next_phase", "queue", "initialized", "algo", "dataset",
                 "ring", "local")

    def __init__(self, rank: Npu, tag: int, priority: int, phases: list[PhaseSpec], dataset: DataSet,
                 ring: Sequence[tuple[tuple[int, ...], int]], local: bool) -> None:
        self.rank = rank
        self.tag = tag
        self.priority = priority
        self.phases = phases
        self.next_phase = 0
        self.queue = -1
        self.initialized = False
        self.algo: Ring | None = None
        self.dataset = dataset
        self.ring = ring      # per logical dimension: (members in ring order, my index)
        self.local = local    # a sub-group ring (fixed 10 ns endpoint delay)


class Npu:
    """One NPU: the workload (dependencies, slots) and the system layer (queues, streams)."""

    def __init__(self, engine: Any, rank: int, program: Sequence[Op]) -> None:
        # engine: the owning stageopt.astrasim.events.Engine (untyped here: it imports this module)
        self.engine = engine
        self.id = rank
        self.ops: dict[int, Op] = {}
        for op in program:
            if op.id in self.ops:
                raise ConfigError(f"rank {rank}: node id {op.id} appears twice; node ids must be unique per rank")
            self.ops[op.id] = op
        self.children: dict[int, list[int]] = {i: [] for i in self.ops}
        self.waiting: dict[int, int] = {}
        self.free: set[int] = set()
        for op in program:
            deps = set(op.deps)
            for d in deps:
                if d not in self.ops:
                    raise ConfigError(f"rank {rank}: node {op.id} depends on node {d}, which is not in the trace")
                self.children[d].append(op.id)
            if deps:
                self.waiting[op.id] = len(deps)
            else:
                self.free.add(op.id)
        self.ongoing = 0
        self.released = 0  # nodes finished, for progress reports
        self.busy = [False, False, False, False]
        self.compute_ns = 0
        self.finish_ns: int | None = None
        self.done = False
        self._batches: dict[int, list[tuple[Callable[[Any], None], Any]]] = {}
        sysc = engine.system
        self.threshold = sysc.active_chunks_per_dimension
        ndims = engine.network.dims
        self.queues: list[list[Stream]] = [[] for _ in range(ndims)]
        self.running = [0] * ndims
        self.priority_counter = 0
        self.num_streams = 0
        self.group_streams: dict[int, int] = {}
        self.total_nodes = engine.network.num_npus

    # -- per-rank batched events (Sys::register_event / call_events) --------
    def register(self, delay: int, fn: Callable[[Any], None], arg: Any) -> None:
        t = self.engine.now + delay
        batch = self._batches.get(t)
        if batch is None:
            batch = self._batches[t] = []
            self.engine.schedule(delay, self._run_batch, t)
        batch.append((fn, arg))

    def _run_batch(self, t: int) -> None:
        batch = self._batches[t]
        i = 0
        while i < len(batch):
            fn, arg = batch[i]
            fn(arg)
            i += 1
        del self._batches[t]

    # -- workload layer ------------------------------------------------------
    def workload_call(self, finished: Op | None = None) -> None:
        """A node finished (or the start): release it, issue what is ready, maybe report."""
        if self.done:
            return
        if finished is not None:
            self._release(finished)
        self._issue_ready()
        if not self.free and self.ongoing == 0 and not any(self.busy[:3]):
            self.done = True
            self.finish_ns = self.engine.now

    def _release(self, op: Op) -> None:
        if op.slot != Slot.NONE:
            self.busy[op.slot] = False
        self.ongoing -= 1
        self.released += 1
        for child in self.children[op.id]:
            left = self.waiting[child] - 1
            self.waiting[child] = left
            if left == 0:
                self.free.add(child)

    def _issue_ready(self) -> None:
        busy = self.busy
        for nid in sorted(self.free):
            op = self.ops[nid]
            if op.slot == Slot.NONE or not busy[op.slot]:
                self._issue(op)

    def _issue(self, op: Op) -> None:
        self.free.discard(op.id)
        self.ongoing += 1
        if op.slot != Slot.NONE:
            self.busy[op.slot] = True
        kind = op.kind
        if kind == OpKind.COMPUTE:
            if op.counts_as_compute:
                self.compute_ns += op.duration_ns
            self.register(op.duration_ns, self.workload_call, op)
        elif kind == OpKind.COLLECTIVE:
            self._generate_collective(op)
        elif kind == OpKind.SEND:
            self.engine.send(self.id, op.peer, NATIVE_TAG_BASE + op.tag % TAG_SPAN, op.size, (self.workload_call, op))
        elif kind == OpKind.RECV:
            self.engine.recv(op.peer, self.id, NATIVE_TAG_BASE + op.tag % TAG_SPAN, op.size, (self.workload_call, op))
        elif kind == OpKind.DELAY:
            self.register(op.duration_ns, self.workload_call, op)
        else:  # SKIP: finish now, children wait for the next issue pass
            self._release(op)

    # -- system layer: collectives, streams, queues --------------------------
    def _generate_collective(self, op: Op) -> None:
        engine = self.engine
        sysc = engine.system
        algos = algos_for(op.comm_type, sysc)
        members = engine.groups.get(op.group) if op.group else None
        if op.group and members is None:
            raise ConfigError(f"rank {self.id}: node {op.id} uses communicator group {op.group}, which the group file lacks")
        if members is None or len(members) == self.total_nodes:
            if len(algos) > engine.network.dims:
                raise ConfigError(
                    f"the system file lists {len(algos)} implementations for {CommType(op.comm_type).name} "
                    f"but the network has {engine.network.dims} dimension(s); give one per dimension"
                )
            dims = tuple(engine.network.npus_count[: len(algos)])
            involved = (True,) * 10 if members is not None else (op.involved_dims or (True,) * 4)
            ring = []
            offset = 1
            for n in dims:
                base = self.id - (self.id // offset) % n * offset
                ring.append((tuple(base + i * offset for i in range(n)), (self.id // offset) % n))
                offset *= n
            local = False
        else:
            if self.id not in members:
                raise ConfigError(f"rank {self.id}: node {op.id} uses group {op.group} {list(members)}, which does not contain it")
            dims = (len(members),)
            algos = algos if len(algos) == 1 else (AlgoSpec(CollectiveAlgo.RING),)
            involved = (True,)
            ring = [(tuple(members), members.index(self.id))]
            local = True
        chunk, count = chunking(op.size, op.comm_type, sysc.preferred_dataset_splits, self.total_nodes)
        phases = plan_phases(op.comm_type, chunk, dims, algos, involved, sysc.local_bw_aware)
        if sysc.scheduling_policy is SchedulingPolicy.LIFO:
            priority = self.priority_counter
            self.priority_counter += 1
        elif sysc.scheduling_policy is SchedulingPolicy.FIFO:
            priority = self.priority_counter
            self.priority_counter -= 1
        else:
            priority = op.priority
        if not phases:
            return  # ASTRA-sim marks the data set inactive and never finishes the node
        dataset = DataSet(count, op)
        for _ in range(count):
            if op.group:
                sid = self.group_streams.get(op.group, op.group * GROUP_STREAM_BASE)
                self.group_streams[op.group] = sid + 1
            else:
                sid = self.num_streams
                self.num_streams += 1
            stream = Stream(self, COLLECTIVE_TAG_BASE + sid % TAG_SPAN, priority, phases, dataset, ring, local)
            self.proceed(stream)

    def _insert(self, queue: list[Stream], stream: Stream) -> None:
        i = 0
        n = len(queue)
        while i < n and (queue[i].initialized or queue[i].priority >= stream.priority):
            i += 1
        queue.insert(i, stream)

    def _start_waiting(self, q: int) -> None:
        queue = self.queues[q]
        i = self.running[q]
        while i < len(queue) and self.running[q] < self.threshold:
            queue[i].initialized = True
            queue[i].algo.start()  # type: ignore[union-attr]
            self.running[q] += 1
            i += 1

    def proceed(self, stream: Stream) -> None:
        """Move a chunk to its next phase, or retire it (Sys::proceed_to_next_vnet_baseline)."""
        prev = stream.queue
        last = stream.next_phase == len(stream.phases)
        if last:
            ds = stream.dataset
            ds.remaining -= 1
            if ds.remaining == 0:
                self.workload_call(ds.op)
        if prev >= 0:
            self.queues[prev].remove(stream)
        if last:
            if prev >= 0:
                self.running[prev] -= 1
                self._start_waiting(prev)
            return
        phase = stream.phases[stream.next_phase]
        stream.next_phase += 1
        stream.queue = phase.dim
        stream.initialized = False
        stream.algo = make_algorithm(stream, phase)
        self._insert(self.queues[phase.dim], stream)
        if prev >= 0:
            self.running[prev] -= 1
            self._start_waiting(prev)
        self._start_waiting(phase.dim)
