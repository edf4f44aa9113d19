"""Zero-bubble step orders: ZB-H1 (looped, one chunk per rank) and ZB-V (two chunks per rank in a V).

Both split the backward into the input gradient ``I``, which the previous stage
waits for, and the weight gradient ``W``, which nothing downstream waits for
and so fills what would be bubbles (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism"; Qi et al. 2024, "Pipeline Parallelism with Controllable Memory").
"""

from __future__ import annotations

from collections import deque

from stageopt.parallel.steps import Step


def zbh1_order(p: int, m: int, stage: int) -> list[Step]:
    """ZB-H1 on stage ``stage`` of ``p``: 1F1B's F and I passes, W passes deferred.

    Stage ``s`` keeps up to ``s`` W passes pending in the steady phase, so it
    holds ``p - s`` micro-batches' full activations plus ``s`` micro-batches'
    weight-gradient inputs — the paper's ``(p - i + 1) M_B + (i - 1) M_W`` for
    worker ``i = s + 1``, whose maximum is 1F1B's ``p M_B`` on the first stage.
    In the cool-down each I pass is followed by one pending W, filling the gap
    while the next gradient travels up; what remains runs at the end.
    """
    warmup = min(p - stage - 1, m)
    steps = [Step(i, 0, "F") for i in range(warmup)]
    pending: deque[int] = deque()

    def backward(i: int, cool_down: bool) -> None:
        steps.append(Step(i, 0, "I"))
        pending.append(i)
        if len(pending) > stage or cool_down:
            steps.append(Step(pending.popleft(), 0, "W"))

    for i in range(m - warmup):
        steps.append(Step(warmup + i, 0, "F"))
        backward(i, False)
    for i in range(m - warmup, m):
        backward(i, True)
    steps += [Step(i, 0, "W") for i in pending]
    return steps


def zbv_order(p: int, m: int, rank: int) -> list[Step]:
    """ZB-V on ``rank`` of ``p``: local chunk 0 is model stage ``rank``, chunk 1 is ``2p - 1 - rank``.

    Warm-up runs ``2(p - r) - 1`` forwards of chunk 0, then ``r`` pairs of
    chunk-1 and chunk-0 forwards, then ``p - r`` rounds of (F, I, W) on chunk 1;
    the steady phase repeats F, I, W on chunk 0 then on chunk 1; the cool-down
    runs ``r`` (I0, I1) pairs, ``p - r`` (I0, W0) pairs and the remaining W
    passes. Built for at least ``2p - 1`` micro-batches; passes of micro-batches
    beyond ``m`` are dropped, which keeps the order valid for fewer.
    """
    n = max(2 * p - 1, m)
    count = {(c, k): 0 for c in (0, 1) for k in "FIW"}
    steps: list[Step] = []

    def run(chunk: int, kind: str) -> None:
        i = count[(chunk, kind)]
        count[(chunk, kind)] += 1
        steps.append(Step(i, chunk, kind))

    for _ in range(2 * (p - rank) - 1):
        run(0, "F")
    for _ in range(rank):
        run(1, "F")
        run(0, "F")
    for _ in range(p - rank):
        for kind in "FIW":
            run(1, kind)
    while count[(1, "F")] < count[(0, "F")] or count[(0, "F")] < n:
        if count[(0, "F")] < n:
            run(0, "F")
        for chunk, kind in ((0, "I"), (0, "W"), (1, "F"), (1, "I"), (1, "W")):
            run(chunk, kind)
    for _ in range(rank):
        run(0, "I")
        run(1, "I")
    for _ in range(p - rank):
        run(0, "I")
        run(0, "W")
    for chunk in (1, 0):
        while count[(chunk, "W")] < count[(chunk, "I")]:
            run(chunk, "W")
    return [s for s in steps if s.microbatch < m]
