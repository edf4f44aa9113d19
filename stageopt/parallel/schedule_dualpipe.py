"""DualPipe (DeepSeek-AI 2024, DeepSeek-V3 report sec. 3.2.1) and its one-copy V variant, DualPipeV.

DualPipe feeds micro-batches from both ends of the pipeline through two copies
of the model; each rank pairs a forward chunk of one direction with a backward
chunk of the other and runs them overlapped, so one chunk's all-to-all and
pipeline messages hide behind the other's compute. Backward passes at the
edges of the schedule are split into input and weight gradients (zero-bubble
style) to fill the ramp-up and ramp-down. The order below follows the eight
phases of the public reference implementation (deepseek-ai/DualPipe): with
``H`` half-ranks, half-rank ``h`` and ``C`` micro-batches per direction:

1. ``2(H-h-1)`` forwards of phase 0;  2. ``h+1`` (F0, F1) pairs;
3. ``H-h-1`` (I1, W, F1);  4. ``C-2H+h+1`` overlapped pairs (F0&B1, F1&B0);
5. ``H-h-1`` (B1, F1&B0);  6. ``h+1`` (B1, B0), the later half split;
7. ``H-h-1`` (W, I0);  8. ``h+1`` W.

"Phase" 0 is the chunk whose micro-batches enter on the rank's own side. For
DualPipe (``p`` ranks, two copies) ``H = p/2``, ``h = min(r, p-1-r)``,
``C = m/2`` and ranks in the second half swap phases; for DualPipeV (one copy
folded into a V over ``p`` ranks) ``H = p``, ``h = r`` and ``C = m``.
Deferred W passes run in first-in, first-out order.
"""

from __future__ import annotations

from collections import deque

from stageopt.parallel.steps import Step


class _Order:
    """Appends steps with per-(chunk, kind) micro-batch counters and a FIFO of deferred W passes."""

    def __init__(self, chunk_of_phase: tuple[int, int], mb_base: tuple[int, int]) -> None:
        self.chunk_of_phase = chunk_of_phase
        self.mb_base = mb_base
        self.count = {(c, k): 0 for c in (0, 1) for k in "FB"}
        self.weights: deque[tuple[int, int]] = deque()
        self.steps: list[Step] = []

    def forward(self, phase: int, paired: bool = False) -> None:
        chunk = self.chunk_of_phase[phase]
        i = self.count[(chunk, "F")]
        self.count[(chunk, "F")] += 1
        self.steps.append(Step(self.mb_base[chunk] + i, chunk, "F", paired))

    def backward(self, phase: int, split: bool = False) -> None:
        chunk = self.chunk_of_phase[phase]
        i = self.count[(chunk, "B")]
        self.count[(chunk, "B")] += 1
        mb = self.mb_base[chunk] + i
        self.steps.append(Step(mb, chunk, "I" if split else "B"))
        if split:
            self.weights.append((mb, chunk))

    def weight(self) -> None:
        mb, chunk = self.weights.popleft()
        self.steps.append(Step(mb, chunk, "W"))


def dualpipe_order(p: int, m: int, rank: int, bidirectional: bool = True) -> list[Step]:
    """DualPipe (``bidirectional``) or DualPipeV step order of ``rank`` of ``p``; ``m`` micro-batches in all."""
    if bidirectional:
        half_ranks, half_rank, chunks = p // 2, min(rank, p - 1 - rank), m // 2
        second_half = rank >= p // 2
        order = _Order((1, 0) if second_half else (0, 1), (0, chunks))
        middle = rank in (p // 2 - 1, p // 2)
    else:
        half_ranks, half_rank, chunks = p, rank, m
        order = _Order((0, 1), (0, 0))
        middle = rank == p - 1
    h, big_h = half_rank, half_ranks
    for _ in range(2 * (big_h - h - 1)):
        order.forward(0)
    for _ in range(h + 1):
        order.forward(0)
        order.forward(1)
    for _ in range(big_h - h - 1):
        order.backward(1, split=True)
        order.weight()
        order.forward(1)
    for i in range(chunks - 2 * big_h + h + 1):
        if i == 0 and middle:  # the middle ranks do not overlap their first pair (smaller bubble)
            order.forward(0)
            order.backward(1)
        else:
            order.forward(0, paired=True)
            order.backward(1)
        order.forward(1, paired=True)
        order.backward(0)
    for _ in range(big_h - h - 1):
        order.backward(1)
        order.forward(1, paired=True)
        order.backward(0)
    split = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        order.backward(1, split=split)
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        order.backward(0, split=split)
    for _ in range(big_h - h - 1):
        order.weight()
        order.backward(0, split=True)
    while order.weights:
        order.weight()
    return order.steps
