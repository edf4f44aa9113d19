"""Zero-bubble and DualPipe step orders against the closed forms of their papers, on small cases.

The orders are timed with fixed pass times and free messages (stageopt.parallel.schedule_timing);
memory walks them with stageopt.parallel.schedule.peak_in_flight.
"""

import itertools

import pytest

from stageopt.parallel.schedule import peak_in_flight
from stageopt.parallel.schedule_dualpipe import dualpipe_order
from stageopt.parallel.schedule_timing import PassTimes, time_orders
from stageopt.parallel.schedule_zb import zb2p_order, zbh1_order, zbv_order
from stageopt.parallel.steps import Step

TIMES = [(1, 1, 1), (1, 1, 0.5), (2, 1.5, 1), (1, 2, 1), (1.3, 0.7, 0.6)]  # (F, I, W), W <= F + I


def one_f_one_b(p: int, m: int, s: int) -> list[Step]:
    warmup = min(p - s - 1, m)
    steps = [Step(i, 0, "F") for i in range(warmup)]
    for i in range(m - warmup):
        steps += [Step(warmup + i, 0, "F"), Step(i, 0, "B")]
    return steps + [Step(i, 0, "B") for i in range(m - warmup, m)]


def every_pass_once(order: list[Step]) -> None:
    seen: dict[tuple[int, int], str] = {}
    for step in order:
        key = (step.microbatch, step.chunk)
        state = seen.get(key, "")
        assert state + step.kind in ("F", "FB", "FI", "FIW"), (key, state, step.kind)
        seen[key] = state + step.kind
    assert all(v in ("FB", "FIW") for v in seen.values())


@pytest.mark.parametrize("times, p, m", list(itertools.product(TIMES, (2, 4, 8), (8, 16))))
def test_zbh1_bubble_is_p_minus_1_times_f_plus_b_minus_w(times, p, m):
    """Qi et al. 2023 sec. 2.1: ZB-H1 bubble (p-1)(T_F + T_B - T_W), 1F1B's (p-1)(T_F + T_B + T_W)
    (their T_B is the input-gradient pass)."""
    f, i, w = times
    t = PassTimes(f, i, w)
    zb = [zbh1_order(p, m, s) for s in range(p)]
    for order in zb:
        every_pass_once(order)
    assert time_orders("zbh1", p, 1, m, zb, t).bubble == pytest.approx((p - 1) * (f + i - w))
    base = time_orders("1f1b", p, 1, m, [one_f_one_b(p, m, s) for s in range(p)], t)
    assert base.bubble == pytest.approx((p - 1) * (f + i + w))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zbh1_memory_matches_the_paper_per_worker(p):
    """Worker i holds (p - i + 1) M_B + (i - 1) M_W: at most 1F1B's p M_B, on the first worker."""
    m_b, m_w = 10.0, 3.0
    for s in range(p):
        order = zbh1_order(p, 3 * p, s)
        assert peak_in_flight(order, {0: m_b}, {0: m_w}) == pytest.approx((p - s) * m_b + s * m_w)


@pytest.mark.parametrize("f, p, m", [(f, p, m) for f in (1.0, 0.7) for p in (2, 4, 8) for m in (8, 16, 24)
                                     if m >= 2 * p - 1])
def test_zbv_has_no_bubble_beyond_the_fill_and_1f1b_memory(f, p, m):
    """Qi et al. 2023 sec. 6: with T_F = T_B = T_W ZB-V has zero bubble at 1F1B's peak memory p M_B.
    What remains idle is the fill no schedule avoids: the last rank's first input needs p-1 forward
    chunks. Memory is in chunk units (a chunk is half a stage): 2p chunks = p M_B, on every worker."""
    orders = [zbv_order(p, m, r) for r in range(p)]
    for order in orders:
        every_pass_once(order)
    timing = time_orders("zbv", p, 2, m, orders, PassTimes(f, f, f))
    assert timing.bubble == pytest.approx((p - 1) * f)
    peaks = [peak_in_flight(o, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}) for o in orders]
    assert peaks == [2 * p] * p


def back_to_back(order: list[Step], m: int) -> list[Step]:
    """One stage's order for two iterations run without a synchronisation between them."""
    return list(order) + [Step(s.microbatch + m, s.chunk, s.kind) for s in order]


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 16), (8, 16), (8, 24), (16, 48)])
def test_zb2p_has_no_bubble_once_iterations_overlap(p, m):
    """Qi et al. 2024 secs. 2.2 and 4: with T_F = T_B = T_W the 2p-memory schedule is a parallelogram, each
    stage ending as much later than the one before it as it started, so once the optimizer's synchronisation
    is bypassed an iteration takes m (T_F + T_B + T_W): the second of two back-to-back iterations ends
    exactly 3m after the first. One iteration alone keeps its fill (the last stage starts p - 1 passes
    late); 1F1B, whose first stage starts first and
    ends last, gains nothing from the overlap."""
    t = PassTimes(1.0, 1.0, 1.0)
    orders = [zb2p_order(p, m, s) for s in range(p)]
    for order in orders:
        every_pass_once(order)
    one = time_orders("zb2p", p, 1, m, orders, t).makespan
    two = time_orders("zb2p", p, 1, 2 * m, [back_to_back(o, m) for o in orders], t).makespan
    assert two - one == pytest.approx(3 * m)
    assert one == pytest.approx(3 * m + p - 1)  # the last stage starts p - 1 forwards late, then never waits
    base = [one_f_one_b(p, m, s) for s in range(p)]
    single = time_orders("1f1b", p, 1, m, base, t).makespan
    paired = time_orders("1f1b", p, 1, 2 * m, [back_to_back(o, m) for o in base], t).makespan
    assert paired - single == pytest.approx(single)


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 16), (8, 16), (8, 24)])
def test_zb2p_keeps_at_most_2p_micro_batches_and_the_first_stage_reaches_zb_h2s_peak(p, m):
    """The limit ZB-2p is named after: 2p micro-batches' activations per stage, a micro-batch counting until its
    weight gradient; the first stage fills to at least ZB-H2's (2p - 1) M_B (Qi et al. 2024, Table 2)."""
    peaks = [peak_in_flight(zb2p_order(p, m, s), {0: 1.0}, {0: 1.0}) for s in range(p)]
    assert max(peaks) <= 2 * p
    assert peaks[0] >= min(2 * p - 1, m)


@pytest.mark.parametrize("p, m, f, bidirectional", [
    (p, m, f, b) for p, m in ((2, 4), (4, 8), (4, 16), (8, 16), (8, 32), (16, 32)) for f in (1.0, 2.5)
    for b in (True, False)])
def test_dualpipe_bubble_and_memory_match_deepseek_v3_table(p, m, f, bidirectional):
    """DeepSeek-V3 report, Table 2: DualPipe bubble (PP/2 - 1)(F&B + B - 3W), activation PP + 1 chunks.
    With equal pass times and F&B = F + B (no overlap gain) the orders give the formula exactly; DualPipeV
    folds the same 2p-chunk pipeline onto p ranks (PP = 2p, one copy). The 2x parameters of DualPipe's
    two copies are checked on the workload (tests/core/test_schedule_wiring.py)."""
    i = w = f
    stages = p if bidirectional else 2 * p
    orders = [dualpipe_order(p, m, r, bidirectional) for r in range(p)]
    for order in orders:
        every_pass_once(order)
    timing = time_orders("dualpipe" if bidirectional else "dualpipev", p, 2, m, orders,
                         PassTimes(f, i, w, fb=f + i + w))
    assert timing.bubble == pytest.approx((stages / 2 - 1) * (f + (i + w) + (i + w) - 3 * w))
    peaks = [peak_in_flight(o, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}) for o in orders]
    assert peaks == [stages + 1] * p


def test_dualpipe_overlap_shortens_the_iteration():
    """Pairs of overlapped chunks (F&B < F + B) make the same orders finish earlier."""
    p, m = 8, 32
    orders = [dualpipe_order(p, m, r) for r in range(p)]
    plain = time_orders("dualpipe", p, 2, m, orders, PassTimes(1, 1, 1, fb=3)).makespan
    overlapped = time_orders("dualpipe", p, 2, m, orders, PassTimes(1, 1, 1, fb=2.2)).makespan
    pairs = sum(s.paired for s in orders[0])
    assert overlapped == pytest.approx(plain - 0.8 * pairs, rel=0.05)
