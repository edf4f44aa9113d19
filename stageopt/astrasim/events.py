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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stageopt.astrasim.collective_timing import Link, pair_link
from stageopt.astrasim.configs import NetworkConfig, SystemConfig
from stageopt.astrasim.npu import Npu
from stageopt.astrasim.records import Op, OpKind, RankResult, Slot
from stageopt.errors import ConfigError

__all__ = ["Engine", "Op", "OpKind", "RankResult", "Slot", "simulate"]

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
        self.ranks = [Npu(self, r, prog) for r, prog in enumerate(programs)]

    # -- global event queue -------------------------------------------------
    def schedule(self, delay: int, fn: Callable[[Any], None], arg: Any) -> None:
        """Global FIFO-within-a-tick queue (the analytical backend's EventQueue)."""
        self._seq += 1
        heapq.heappush(self._heap, (self.now + delay, self._seq, fn, arg))

    def run(self, on_tick: Callable[["Engine"], None] | None = None, every: int = 1 << 16) -> list[RankResult]:
        """Run to completion; ``on_tick(engine)`` is called every ``every`` events (progress reports)."""
        for rank in self.ranks:
            rank.workload_call()
        heap = self._heap
        pop = heapq.heappop
        count = 0
        while heap:
            t, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
            if on_tick is not None:
                count += 1
                if count == every:
                    count = 0
                    on_tick(self)
        return [RankResult(r.finish_ns, r.compute_ns) for r in self.ranks]

    def nodes_finished(self) -> int:
        """Trace nodes finished so far on all ranks."""
        return sum(r.released for r in self.ranks)

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


def simulate(programs: Sequence[Sequence[Op]], groups: Mapping[int, Sequence[int]],
             system: SystemConfig, network: NetworkConfig,
             on_tick: Callable[[Engine], None] | None = None) -> list[RankResult]:
    """Replay one program per rank and return each rank's finish and compute time."""
    return Engine(programs, groups, system, network).run(on_tick)
