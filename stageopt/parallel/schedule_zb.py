"""Zero-bubble step orders: ZB-H1 and ZB-2p (looped, one chunk per rank) and ZB-V (two chunks per rank in a V).

Both split the backward into the input gradient ``I``, which the previous stage
waits for, and the weight gradient ``W``, which nothing downstream waits for
and so fills what would be bubbles (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism"; Qi et al. 2024, "Pipeline Parallelism with Controllable Memory").
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

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


def zb2p_order(p: int, m: int, stage: int) -> list[Step]:
    """ZB-2p on stage ``stage`` of ``p`` (Qi et al. 2024, sec. 3.1): the order :func:`zb2p_orders` finds."""
    return list(zb2p_orders(p, m)[stage])


@lru_cache(maxsize=64)
def zb2p_orders(p: int, m: int) -> tuple[tuple[Step, ...], ...]:
    """Every stage's order under the zero-bubble paper's scheduling rules, with ``2p`` micro-batches'
    activations allowed in flight per stage (ZB-2p).

    The paper's heuristic (sec. 3.1): in the warm-up, as many forwards as the memory limit allows; then
    forwards and input gradients in turn, a weight gradient wherever the stage would otherwise wait or the
    memory limit is hit; the remaining weight gradients at the end. Here it runs once on unit pass times
    (F = I = W, the paper's handcrafted setting) as a list schedule: each free stage takes an input
    gradient whose output gradient has arrived, else the next forward whose input has arrived and fits
    under the limit, else a pending weight gradient. A micro-batch counts against the limit from its
    forward to its weight gradient. The orders depend on the shape alone, so one order prices every
    plan of that shape with its own pass times (the paper searches per measured times, which this
    leaves out: its Table 5 puts that search's bubble within 1% in most setups).
    """
    limit = 2 * p
    f_done = [[None] * m for _ in range(p)]  # finish time of each forward, per stage
    i_done = [[None] * m for _ in range(p)]
    next_f, next_i = [0] * p, [0] * p
    pending: list[deque[int]] = [deque() for _ in range(p)]
    orders: list[list[Step]] = [[] for _ in range(p)]
    t = 0
    while any(len(o) < 3 * m for o in orders):
        for s in range(p):
            j, k = next_i[s], next_f[s]
            grad = j < k and f_done[s][j] is not None and f_done[s][j] <= t and (
                s == p - 1 or (i_done[s + 1][j] is not None and i_done[s + 1][j] <= t))
            ready = k < m and (s == 0 or (f_done[s - 1][k] is not None and f_done[s - 1][k] <= t))
            if grad:
                i_done[s][j], next_i[s] = t + 1, j + 1
                pending[s].append(j)
                orders[s].append(Step(j, 0, "I"))
            elif ready and k - (next_i[s] - len(pending[s])) < limit:
                f_done[s][k], next_f[s] = t + 1, k + 1
                orders[s].append(Step(k, 0, "F"))
            elif pending[s]:
                orders[s].append(Step(pending[s].popleft(), 0, "W"))
        t += 1
    return tuple(tuple(o) for o in orders)


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
