"""One unit of pipeline work: a micro-batch's forward or backward through one local chunk."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True, slots=True)
class Step:
    """``kind``: F forward, B full backward, I input-gradient backward, W weight-gradient backward.

    ``paired``: this step runs overlapped with the next one in the order (a
    DualPipe forward-and-backward chunk pair, or a combined-1F1B pair under ``ep_overlap``).
    """

    microbatch: int
    chunk: int  # local model chunk on this stage
    kind: str
    paired: bool = False
