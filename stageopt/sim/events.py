"""Discrete-event replay with ASTRA-sim's congestion-unaware semantics.

The input is a plain program per rank (:class:`Op` records), so traces read
from files and programs built in memory run through the same engine.

What is modelled, after ASTRA-sim 518bd51 (``Workload.cc``, ``Sys.cc``,
``HardwareResource.cc``, the ring/direct/halving-doubling algorithms and the
analytical network frontend):

* Per rank one GPU compute slot, one CPU slot and one communication slot
  (collectives, sends and broadcasts share it; receives take none). Whenever a
  node finishes, the ready nodes are issued in ascending id order, each if its
  slot is free. Skipped nodes (roofline with ``tensor_size`` 0, invalid nodes)
  release their children without a new issue pass, as ASTRA-sim does.
* Collectives are not synchronised explicitly: each rank cuts its collective
  into chunks, runs them through per-dimension queues and exchanges messages;
  a message is delivered when it has arrived *and* the receiver has posted the
  matching receive (matched by tag, peers, size and sequence number).
* Events of one rank that fall on the same nanosecond run as one batch, and
  the global queue is FIFO within a nanosecond, as in ASTRA-sim, so ties are
  broken the same way.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from stageopt.chakra import CommType
from stageopt.errors import ConfigError
from stageopt.sim.astra_configs import AlgoSpec, CollectiveAlgo, NetworkConfig, SchedulingPolicy, SystemConfig
from stageopt.sim.collectives import (
    SUBGROUP_ENDPOINT_DELAY_NS,
    Direction,
    Link,
    PhaseSpec,
    algos_for,
    chunking,
    pair_link,
    phase_sizes,
    plan_phases,
    reduction_delay_ns,
)

NATIVE_TAG_BASE = 0
COLLECTIVE_TAG_BASE = 500_000_000
TAG_SPAN = 500_000_000
GROUP_STREAM_BASE = 1_000_000


class OpKind(IntEnum):
    """What a node does once issued."""

    COMPUTE = 0     # busy for duration_ns (roofline or trace duration)
    COLLECTIVE = 1  # chunked collective over a group
    SEND = 2        # point-to-point send; done when the message has arrived
    RECV = 3        # point-to-point receive; done when the message is delivered
    DELAY = 4       # communication replayed from its duration (BROADCAST)
    SKIP = 5        # finishes at once without a new issue pass


class Slot(IntEnum):
    """Per-rank hardware slot a node occupies while it runs."""

    GPU = 0
    CPU = 1
    COMM = 2
    NONE = 3


@dataclass(frozen=True, slots=True)
class Op:
    """One node of a rank's program, independent of the Chakra encoding.

    ``deps`` merges data and control dependencies. ``counts_as_compute`` adds
    ``duration_ns`` to the GPU compute time that "exposed communication" is
    measured against. ``group`` 0 means all ranks; ``peer`` is the other rank of
    a send or receive.
    """

    id: int
    kind: OpKind
    slot: Slot
    deps: tuple[int, ...] = ()
    duration_ns: int = 0
    counts_as_compute: bool = False
    comm_type: CommType = CommType.ALL_REDUCE
    size: int = 0
    group: int = 0
    peer: int = -1
    tag: int = 0
    priority: int = 0
    involved_dims: tuple[bool, ...] | None = None


@dataclass(frozen=True, slots=True)
class RankResult:
    """When a rank finished (None: it never did) and how long its GPU computed."""

    finish_ns: int | None
    compute_ns: int


class _Msg:
    """Matching entry for one message: its send and receive callbacks."""

    __slots__ = ("send", "recv", "arrived")

    def __init__(self) -> None:
        self.send: tuple[Callable[[Any], None], Any] | None = None
        self.recv: tuple[Callable[[Any], None], Any] | None = None
        self.arrived = False


class Engine:
    """Runs one program per rank to completion; see the module docstring."""

    def __init__(self, programs: Sequence[Sequence[Op]], groups: Mapping[int, Sequence[int]],
                 system: SystemConfig, network: NetworkConfig) -> None:
        if len(programs) != network.num_npus:
            raise ConfigError(
                f"the network has {network.num_npus} NPUs (product of npus_count) but {len(programs)} rank programs were given"
            )
        self.system = system
        self.network = network
        self.groups = {g: tuple(m) for g, m in groups.items()}
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._links: dict[tuple[int, int], Link] = {}
        self._send_ids: dict[tuple[int, int, int, int], int] = {}
        self._recv_ids: dict[tuple[int, int, int, int], int] = {}
        self._msgs: dict[tuple[int, int, int, int, int], _Msg] = {}
        self.ranks = [_Rank(self, r, prog) for r, prog in enumerate(programs)]

    # -- global event queue -------------------------------------------------
    def schedule(self, delay: int, fn: Callable[[Any], None], arg: Any) -> None:
        """Global FIFO-within-a-tick queue (the analytical backend's EventQueue)."""
        self._seq += 1
        heapq.heappush(self._heap, (self.now + delay, self._seq, fn, arg))

    def run(self) -> list[RankResult]:
        for rank in self.ranks:
            rank.workload_call()
        heap = self._heap
        pop = heapq.heappop
        while heap:
            t, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
        return [RankResult(r.finish_ns, r.compute_ns) for r in self.ranks]

    # -- network: congestion-unaware, eager sends, matched receives ---------
    def link(self, src: int, dst: int) -> Link:
        key = (src, dst)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = pair_link(self.network, src, dst)
        return link

    def send(self, src: int, dst: int, tag: int, size: int, handler: tuple[Callable[[Any], None], Any] | None) -> None:
        key = (tag, src, dst, size)
        cid = self._send_ids.get(key, 0) + 1
        self._send_ids[key] = cid
        mkey = (tag, src, dst, size, cid)
        msg = self._msgs.get(mkey)
        if msg is None:
            msg = self._msgs[mkey] = _Msg()
        msg.send = handler
        link = self.link(src, dst)
        self.schedule(int(link.latency_ns + size / link.bytes_per_ns), self._arrive, mkey)

    def recv(self, src: int, dst: int, tag: int, size: int, handler: tuple[Callable[[Any], None], Any]) -> None:
        key = (tag, src, dst, size)
        cid = self._recv_ids.get(key, 0) + 1
        self._recv_ids[key] = cid
        mkey = (tag, src, dst, size, cid)
        msg = self._msgs.get(mkey)
        if msg is None:
            msg = self._msgs[mkey] = _Msg()
            msg.recv = handler
        elif msg.arrived:
            del self._msgs[mkey]
            self.schedule(0, handler[0], handler[1])
        else:
            msg.recv = handler

    def _arrive(self, mkey: tuple[int, int, int, int, int]) -> None:
        msg = self._msgs[mkey]
        if msg.send is not None:
            msg.send[0](msg.send[1])
        if msg.recv is not None:
            del self._msgs[mkey]
            msg.recv[0](msg.recv[1])
        else:
            msg.arrived = True


class _DataSet:
    """All chunks of one collective on one rank; finishing the last one finishes the node."""

    __slots__ = ("remaining", "op")

    def __init__(self, chunks: int, op: Op) -> None:
        self.remaining = chunks
        self.op = op


class _Stream:
    """One chunk of a collective on one rank, walking its phases through the queues."""

    __slots__ = ("rank", "tag", "priority", "phases", "next_phase", "queue", "initialized", "algo", "dataset",
                 "ring", "local")

    def __init__(self, rank: _Rank, tag: int, priority: int, phases: list[PhaseSpec], dataset: _DataSet,
                 ring: Sequence[tuple[tuple[int, ...], int]], local: bool) -> None:
        self.rank = rank
        self.tag = tag
        self.priority = priority
        self.phases = phases
        self.next_phase = 0
        self.queue = -1
        self.initialized = False
        self.algo: _Algorithm | None = None
        self.dataset = dataset
        self.ring = ring      # per logical dimension: (members in ring order, my index)
        self.local = local    # a sub-group ring (fixed 10 ns endpoint delay)


class _Rank:
    """One NPU: the workload (dependencies, slots) and the system layer (queues, streams)."""

    def __init__(self, engine: Engine, rank: int, program: Sequence[Op]) -> None:
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
        self.busy = [False, False, False, False]
        self.compute_ns = 0
        self.finish_ns: int | None = None
        self.done = False
        self._batches: dict[int, list[tuple[Callable[[Any], None], Any]]] = {}
        sysc = engine.system
        self.threshold = sysc.active_chunks_per_dimension
        ndims = engine.network.dims
        self.queues: list[list[_Stream]] = [[] for _ in range(ndims)]
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
        dataset = _DataSet(count, op)
        for _ in range(count):
            if op.group:
                sid = self.group_streams.get(op.group, op.group * GROUP_STREAM_BASE)
                self.group_streams[op.group] = sid + 1
            else:
                sid = self.num_streams
                self.num_streams += 1
            stream = _Stream(self, COLLECTIVE_TAG_BASE + sid % TAG_SPAN, priority, phases, dataset, ring, local)
            self.proceed(stream)

    def _insert(self, queue: list[_Stream], stream: _Stream) -> None:
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

    def proceed(self, stream: _Stream) -> None:
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
        stream.algo = _make_algorithm(stream, phase)
        self._insert(self.queues[phase.dim], stream)
        if prev >= 0:
            self.running[prev] -= 1
            self._start_waiting(prev)
        self._start_waiting(phase.dim)


class _Algorithm:
    """Per-rank packet state machine of one phase (ASTRA-sim's Ring and its relatives).

    Each inserted packet waits an endpoint delay (plus a reduction when it
    carries data to reduce); then one message goes out and a receive is
    posted. A received message inserts the next packet. The phase ends when
    all messages are sent and ``parallel`` packets have come back.
    """

    __slots__ = ("stream", "rank", "comm_type", "nodes", "members", "index", "direction", "msg_size",
                 "steps", "parallel", "zero", "nonzero", "toggle", "packets", "free", "received",
                 "endpoint", "receiver", "sender", "local")

    def __init__(self, stream: _Stream, phase: PhaseSpec) -> None:
        self.stream = stream
        self.rank = stream.rank
        self.comm_type = phase.comm_type
        members, index = stream.ring[phase.dim]
        self.members = members
        self.index = index
        self.nodes = len(members)
        self.direction = phase.direction
        self.msg_size, _ = phase_sizes(phase.comm_type, phase.algo, self.nodes, phase.data_size)
        self.local = stream.local
        self.endpoint = SUBGROUP_ENDPOINT_DELAY_NS if stream.local else stream.rank.engine.system.endpoint_delay_ns
        self.parallel = 1
        self.zero = 0
        self.nonzero = 0
        self.toggle = False
        self.packets: deque[tuple[int, int, int]] = deque()
        self.free = 0
        self.received = 0
        step = 1 if self.direction == Direction.CLOCKWISE else -1
        self.receiver = members[(index + step) % self.nodes]
        self.sender = members[(index - step) % self.nodes]
        self.steps = self._steps()

    # hooks the variants override
    def _steps(self) -> int:
        if self.comm_type == CommType.ALL_REDUCE:
            return 2 * (self.nodes - 1)
        if self.comm_type == CommType.ALL_TO_ALL:
            return self.nodes * (self.nodes - 1) // 2
        return self.nodes - 1

    def _nonzero_packets(self) -> int:
        return (self.nodes - 1) * self.parallel

    def _after_release(self) -> None:
        """Called after each packet is handed to the endpoint (peer rotation etc.)."""

    def start(self) -> None:
        for _ in range(self.parallel):
            self._insert_packet()

    def _insert_packet(self) -> None:
        if self.zero == 0 and self.nonzero == 0:
            self.zero = self.parallel
            self.nonzero = self._nonzero_packets()
            self.toggle = not self.toggle
        if self.zero > 0:
            processed = False
            self.zero -= 1
        elif self.nonzero > 0:
            processed = self.comm_type == CommType.REDUCE_SCATTER or (self.comm_type == CommType.ALL_REDUCE and self.toggle)
            self.nonzero -= 1
        else:
            raise RuntimeError("collective phase inserted a packet it has no room for")
        self.packets.append((self.receiver, self.sender, self.msg_size))
        self.rank.register(self.endpoint, self._bundle_done, processed and self.msg_size or 0)
        self._after_release()

    def _bundle_done(self, reduce_bytes: int) -> None:
        if reduce_bytes:
            delay = reduction_delay_ns(reduce_bytes, self.rank.engine.system.local_mem_bw_gbps)
            self.rank.register(delay, self._bundle_done, 0)
            return
        self.free += 1
        self._general()

    def _general(self) -> None:
        self._ready()
        self._check_done()

    def _ready(self) -> bool:
        if not self.packets or self.steps == 0 or self.free == 0:
            return False
        dst, src, size = self.packets.popleft()
        engine = self.rank.engine
        me = self.rank.id
        tag = self.stream.tag
        engine.send(me, dst, tag, size, None)
        engine.recv(src, me, tag, size, (self._on_receive, None))
        self.steps -= 1
        self.free -= 1
        return True

    def _check_done(self) -> None:
        if self.steps == 0 and self.free == self.parallel:
            self.rank.proceed(self.stream)

    def _on_receive(self, _: Any) -> None:
        self.received += 1
        self._insert_packet()


class _Direct(_Algorithm):
    """ASTRA-sim's ``AllToAll`` ("direct"): ``window`` packets in flight, peers rotate."""

    __slots__ = ("middle",)

    def __init__(self, stream: _Stream, phase: PhaseSpec) -> None:
        super().__init__(stream, phase)
        self.middle = self.nodes - 1
        window = phase.algo.window
        self.parallel = self.nodes - 1 if window == -1 else min(window, self.nodes - 1)
        if self.comm_type == CommType.ALL_TO_ALL:
            self.steps = self.nodes - 1

    def _nonzero_packets(self) -> int:
        return (self.nodes - 1) * self.parallel if self.local else self.parallel

    def _after_release(self) -> None:
        step = 1 if self.direction == Direction.CLOCKWISE else -1
        me = self.rank.id
        pos = self.members.index(self.receiver)
        self.receiver = self.members[(pos + step) % self.nodes]
        if self.receiver == me:
            self.receiver = self.members[(pos + 2 * step) % self.nodes]
        pos = self.members.index(self.sender)
        self.sender = self.members[(pos - step) % self.nodes]
        if self.sender == me:
            self.sender = self.members[(pos - 2 * step) % self.nodes]

    def _general(self) -> None:
        if self.comm_type == CommType.ALL_REDUCE and self.steps <= self.middle:
            if self.received < self.middle:
                return
            for _ in range(self.parallel):
                self._ready()
            self._check_done()
            return
        self._ready()
        self._check_done()


class _HalvingDoubling(_Algorithm):
    """ASTRA-sim's ``HalvingDoubling``: log2(n) exchanges at doubling (or halving) distance."""

    __slots__ = ("offset", "multiplier")

    def __init__(self, stream: _Stream, phase: PhaseSpec) -> None:
        super().__init__(stream, phase)
        n = self.nodes
        if n & (n - 1):
            raise ConfigError(f"halvingDoubling needs a power-of-two group size, got {n} ranks; use 'ring'")
        log = n.bit_length() - 1
        self.steps = 2 * log if self.comm_type == CommType.ALL_REDUCE else log
        if self.comm_type == CommType.ALL_GATHER:
            self.offset, self.multiplier = n // 2, 0.5
        else:
            self.offset, self.multiplier = 1, 2.0
        self._aim()

    def _nonzero_packets(self) -> int:
        return (self.nodes.bit_length() - 1) - self.parallel

    def _aim(self) -> None:
        if self.offset == 0:
            forward = True
        else:
            forward = (self.index // self.offset) % 2 == 0
        step = self.offset if forward else -self.offset
        self.receiver = self.sender = self.members[(self.index + step) % self.nodes]

    def _after_release(self) -> None:
        self.offset = int(self.offset * self.multiplier)
        self.msg_size = int(self.msg_size / self.multiplier)
        if self.offset == self.nodes and self.comm_type == CommType.ALL_REDUCE:
            self.multiplier = 0.5
            self.offset = int(self.offset * self.multiplier)
            self.msg_size = int(self.msg_size / self.multiplier)
        self._aim()


def _make_algorithm(stream: _Stream, phase: PhaseSpec) -> _Algorithm:
    kind = phase.algo.algo
    if kind is CollectiveAlgo.RING:
        return _Algorithm(stream, phase)
    if kind is CollectiveAlgo.DIRECT:
        return _Direct(stream, phase)
    return _HalvingDoubling(stream, phase)


def simulate(programs: Sequence[Sequence[Op]], groups: Mapping[int, Sequence[int]],
             system: SystemConfig, network: NetworkConfig) -> list[RankResult]:
    """Replay one program per rank and return each rank's finish and compute time."""
    return Engine(programs, groups, system, network).run()
