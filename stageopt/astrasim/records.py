"""The records the ASTRA-sim-compatible engine reads and returns (no behaviour).

A rank's program is a list of :class:`Op`; :func:`stageopt.astrasim.events.simulate`
returns one :class:`RankResult` per rank. Kept apart so trace readers and
in-memory programs build the same records without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from stageopt.chakra import CommType

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
