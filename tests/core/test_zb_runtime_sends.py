"""The zero-bubble fork's runtime: a send followed by a W pass does not hold its stage.

The fork (``zb_schedules.py`` at f68d3879) batches each send with the receives
posted after it and waits on the whole batch before the pass that consumes
them; a W pass receives nothing, so a send just before it is flushed alone and
overlaps the W, delaying only the pass on the other stage that consumes it.
"""

import dataclasses

import numpy as np
import pytest

from stageopt.frameworks import load_profile
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.parallel.schedule import schedule_orders
from stageopt.parallel.schedule_dag import compile_dag
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.workload import build_workload


def _dag():
    """ZB-H1 on 2 stages, 2 micro-batches: stage 0 runs F0 F1 I0 W0 I1 W1, stage 1 F0 I0 F1 I1 W0 W1."""
    return compile_dag("zbh1", 2, 1, schedule_orders("zbh1", 2, 1, 2))


def test_next_pass_on_each_stage():
    dag = _dag()
    nxt = dag.next_on_stage()
    assert [int(dag.kind[n]) if n >= 0 else -1 for n in nxt] == [0, 2, 2, 0, 2, 3, 3, -1, 3, 2, 3, -1]


def test_a_message_in_flight_delays_only_its_consumer_on_the_other_stage():
    """Every pass 1 s: the schedule ends at 7 s (worked by hand in the module's order). Stage 1's I1 (node 5)
    ending with a 0.5 s message not waited for: stage 0's I1 starts at 5.5 s instead of 5, so the step ends
    at 7.5; stage 1's own W1, which reads I1's output on the same GPU, is not delayed."""
    dag = _dag()
    ones = np.ones((dag.size, 1))
    assert dag.finish_times(ones).max() == pytest.approx(7.0)
    arrival = np.zeros((dag.size, 1))
    arrival[5] = 0.5
    finish = dag.finish_times(ones, arrival)
    assert finish[10, 0] == pytest.approx(6.5) and finish[7, 0] == pytest.approx(7.0)
    assert finish.max() == pytest.approx(7.5)
    arrival[:] = 0
    arrival[2] = 0.5  # stage 1's F0: its only consumer (I0) is on the same stage
    assert dag.finish_times(ones, arrival).max() == pytest.approx(7.0)


def _iteration(schedule: str, framework) -> float:
    model = load_model("llama3-8b", ["layers=30", "vocab=1024"])
    plan = Plan.parse(f"pp=16 mbs=1 gbs=32 schedule={schedule} layout=Et|(tt|)*14tL", framework=framework)
    return AnalyticalSimulator().evaluate(build_workload(model, plan), load_hardware("a100-80g")).iteration_time_s


def test_only_the_forks_zero_bubble_schedules_overlap_sends():
    zb = load_profile("zero-bubble")
    blocking = dataclasses.replace(zb, async_p2p_schedules=())
    assert _iteration("zbh1", zb) < _iteration("zbh1", blocking)  # 16 stages on 8-GPU nodes: a network hop
    assert _iteration("1f1b", zb) == pytest.approx(_iteration("1f1b", blocking))
