"""The softmax inside flash attention: one exponential per score on the special-function units.

Checked by hand through the analytical model: a one-layer model at sequence s with H query heads computes
s^2 H / 2 causal scores forward and the backward recomputes each once, so pricing the exponentials adds
exactly s^2 H / exp_tops seconds per micro-batch, whatever the head dims (MHA / GQA or MLA's 192 + 128).
"""

from __future__ import annotations

import dataclasses

import pytest

from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload


def _compute_s(model_name: str, sets: list[str], exp_tops: float | None, simulator=AnalyticalSimulator) -> float:
    model = load_model(model_name, sets)
    plan = Plan.parse("tp=1 pp=1 dp=1 mbs=1 gbs=1 zero=0")
    hw = load_hardware("h100-sxm")
    hw = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, exp_tops=exp_tops))
    return simulator().evaluate(build_workload(model, plan, 1), hw).time_breakdown_s["compute"]


@pytest.mark.parametrize("model_name, sets, heads", [
    ("llama3-8b", ["layers=1", "seq=4096"], 32),
    ("deepseek-v3", ["layers=1", "seq=2048", "dense_layers=0"], 128),
])
def test_each_score_pays_one_exponential_forward_and_one_in_backward(model_name, sets, heads) -> None:
    seq = int(sets[1].split("=")[1])
    added = _compute_s(model_name, sets, 3.87) - _compute_s(model_name, sets, None)
    assert added == pytest.approx(2 * seq**2 * heads / 2 / 3.87e12, rel=1e-9)


def test_the_replay_prices_the_exponentials_as_the_analytical_model_does() -> None:
    sets = ["layers=1", "seq=4096"]
    added = [_compute_s("llama3-8b", sets, 3.87, sim) - _compute_s("llama3-8b", sets, None, sim)
             for sim in (AnalyticalSimulator, ReplaySimulator)]
    assert added[1] == pytest.approx(added[0], rel=1e-9)
