"""The engine scheduler and the request simulation on hand-computed cases; plan and traffic parsing."""

from __future__ import annotations

import math

import pytest

from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.serving.deployment import estimate, serve_plan
from stageopt.serving.engine import Engine, Request
from stageopt.serving.serve_plan import ServePlan
from stageopt.serving.step_time import StepModel
from stageopt.serving.step_timer import StepTimer
from stageopt.serving.traffic import Traffic


def test_chunked_prefill_then_decode_by_hand():
    eng = Engine("e", "both", kv_tokens=1024, max_seqs=4, max_tokens=8)
    a, b = Request(0, 0.0, prompt=10, output=3), Request(1, 0.0, prompt=3, output=2)
    eng.waiting.extend([a, b])
    steps = []
    for t in range(1, 8):
        plan = eng.plan_step()
        if plan is None:
            break
        steps.append([(r.rid, n) for r, n in plan.work])
        eng.finish_step(plan, float(t))
    # step 1: a's first chunk fills the budget; step 2: a's last 2 tokens, then b's whole prompt;
    # then both decode until a has 3 tokens and b has 2
    assert steps == [[(0, 8)], [(0, 2), (1, 3)], [(0, 1), (1, 1)], [(0, 1)]]
    assert (a.first_token, a.finish, b.first_token, b.finish) == (2.0, 4.0, 2.0, 3.0)
    assert eng.free_pages == 1024 // 16


def test_preemption_frees_the_newest_request():
    eng = Engine("e", "both", kv_tokens=32, max_seqs=4, max_tokens=64)  # two pages
    a, b = Request(0, 0.0, prompt=16, output=5), Request(1, 0.0, prompt=16, output=5)
    eng.waiting.extend([a, b])
    plan = eng.plan_step()
    assert [n for _, n in plan.work] == [16, 16] and eng.free_pages == 0
    eng.finish_step(plan, 1.0)
    plan = eng.plan_step()  # a needs a third page: b is preempted and waits to recompute
    assert [r.rid for r, _ in plan.work] == [0] and b.preempted == 1 and b.computed == 0
    assert list(eng.waiting) == [b]


def test_single_request_latency_is_its_steps(tmp_path):
    model, hw = load_model("llama3-8b", []), load_hardware("h100-sxm")
    plan = ServePlan.parse("tp=1 max_seqs=8 max_tokens=4096")
    est = estimate(model, hw, plan, Traffic.parse("concurrency=1 input=1000 output=11 requests=1"))
    timer = StepTimer(StepModel(model, hw, plan.pools[0]), 4096, 8)
    prefill = timer.seconds(1000, 1000 * 1001 / 2, 1000, 1)
    decodes = [timer.seconds(1, 1000 + i, 1000 + i, 1) for i in range(1, 11)]
    assert est.sim.ttft[0] == pytest.approx(prefill, rel=1e-12)
    assert est.sim.tpot[0] == pytest.approx(sum(decodes) / 10, rel=1e-12)
    # the closed form spreads prompt work over decode steps (right for many clients, 6% high for one)
    assert est.steady.tpot_s == pytest.approx(decodes[4], rel=0.10)


def test_steady_state_agrees_with_the_simulation_at_moderate_load():
    est = serve_plan("llama3-8b", "tp=1 max_seqs=128 max_tokens=2048",
                     "rate=6 input=uniform:200:600 output=uniform:100:300 requests=600 seed=3")
    assert est.sim.rejected == 0 and not est.steady.saturated
    assert est.steady.tpot_s == pytest.approx(est.sim.percentile("tpot", 50), rel=0.15)
    assert est.steady.output_tokens_per_s == pytest.approx(est.sim.output_tokens_per_s, rel=0.15)


def test_disaggregated_pays_the_kv_transfer():
    traffic = "rate=1 input=4096 output=64 requests=40"
    near = serve_plan("llama3-8b", "prefill: tp=1 x=1 | decode: tp=1 x=1 link=nvlink", traffic)
    far = serve_plan("llama3-8b", "prefill: tp=1 x=1 | decode: tp=1 x=1 link=scaleout", traffic)
    per_rank = 4096 * near.pools[0].memory.kv_per_token
    node, scaleout = load_hardware("h100-sxm").tiers[:2]  # bandwidth each tier reaches (nccl-tests)
    assert far.kv_transfer_s - near.kv_transfer_s == pytest.approx(
        per_rank / (scaleout.achieved_gbps * 1e9) - per_rank / (node.achieved_gbps * 1e9)
        + (scaleout.latency_us - node.latency_us) * 1e-6, rel=1e-9)
    assert far.sim.percentile("ttft", 50) > near.sim.percentile("ttft", 50)


@pytest.mark.parametrize("text, fragment", [
    ("tp=8 tpp=2", "did you mean 'tp'"), ("tp=3 ep=2", "ep=2 must divide tp=3"),
    ("decode: tp=8", "neither one colocated pool"), ("tp=8 wdtype=int4", "wdtype"), ("tp=x", "integer")])
def test_bad_plans_name_the_field(text, fragment):
    with pytest.raises(InfeasiblePlan, match=fragment):
        ServePlan.parse(text)


@pytest.mark.parametrize("text, fragment", [
    ("input=10", "exactly one of rate"), ("rate=2 concurrency=3", "exactly one of rate"),
    ("rate=2 inptu=5", "did you mean 'input'"), ("rate=2 input=normal:5", "takes 2")])
def test_bad_traffic_names_the_field(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        Traffic.parse(text)


def test_plan_that_cannot_hold_weights_is_refused():
    with pytest.raises(InfeasiblePlan, match="no room for a KV cache"):
        serve_plan("llama3-70b", "tp=1", "rate=1", simulate=False)


def test_plan_string_round_trips():
    text = "prefill: tp=4 pp=1 x=2 max_tokens=8192 | decode: tp=8 pp=1 x=1 max_seqs=128 max_tokens=8192 wdtype=fp8"
    assert ServePlan.parse(ServePlan.parse(text).describe()).describe() == ServePlan.parse(text).describe()
    assert ServePlan.parse(text).gpus == 16 and not math.isnan(ServePlan.parse(text).gpus)


def test_noevict_admits_only_whole_requests():
    eng = Engine("e", "both", kv_tokens=48, max_seqs=4, max_tokens=64, sched="noevict")  # three pages
    a, b = Request(0, 0.0, prompt=16, output=16), Request(1, 0.0, prompt=16, output=16)
    eng.waiting.extend([a, b])
    plan = eng.plan_step()
    # a holds pages for 32 tokens (prompt and output); b's 32 would need two more: it waits, nothing preempts
    assert [r.rid for r, _ in plan.work] == [0] and a.pages == 2 and list(eng.waiting) == [b]
    for t in range(1, 17):
        eng.finish_step(plan, float(t))
        plan = eng.plan_step()
        assert a.preempted == 0
    assert a.finish == 16.0 and b.computed == 0 and [r.rid for r, _ in plan.work] == [1]
