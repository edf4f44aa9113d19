"""Per-rank packet state machines of one collective phase (ring, direct, halving-doubling).

They follow ASTRA-sim 518bd51's ``Ring``, ``AllToAll``/direct and
``HalvingDoubling`` classes: what each packet waits for, where its message
goes, and when the phase is done. A machine drives its stream (a
``stageopt.astrasim.npu.Stream``, typed ``Any`` here because that module imports
this one), the stream's rank and the engine's network calls.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from stageopt.astrasim.collective_timing import (
    SUBGROUP_ENDPOINT_DELAY_NS,
    Direction,
    PhaseSpec,
    phase_sizes,
    reduction_delay_ns,
)
from stageopt.astrasim.configs import CollectiveAlgo
from stageopt.chakra import CommType
from stageopt.errors import ConfigError


class Ring:
    """Per-rank packet state machine of one phase (ASTRA-sim's Ring and its relatives).

    Each inserted packet waits an endpoint delay (plus a reduction when it
    carries data to reduce); then one message goes out and a receive is
    posted. A received message inserts the next packet. The phase ends when
    all messages are sent and ``parallel`` packets have come back.
    """

    __slots__ = ("stream", "rank", "comm_type", "nodes", "members", "index", "direction", "msg_size",
                 "steps", "parallel", "zero", "nonzero", "toggle", "packets", "free", "received",
                 "endpoint", "receiver", "sender", "local")

    def __init__(self, stream: Any, phase: PhaseSpec) -> None:
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


class Direct(Ring):
    """ASTRA-sim's ``AllToAll`` ("direct"): ``window`` packets in flight, peers rotate."""

    __slots__ = ("middle",)

    def __init__(self, stream: Any, phase: PhaseSpec) -> None:
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


class HalvingDoubling(Ring):
    """ASTRA-sim's ``HalvingDoubling``: log2(n) exchanges at doubling (or halving) distance."""

    __slots__ = ("offset", "multiplier")

    def __init__(self, stream: Any, phase: PhaseSpec) -> None:
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


def make_algorithm(stream: Any, phase: PhaseSpec) -> Ring:
    kind = phase.algo.algo
    if kind is CollectiveAlgo.RING:
        return Ring(stream, phase)
    if kind is CollectiveAlgo.DIRECT:
        return Direct(stream, phase)
    return HalvingDoubling(stream, phase)
