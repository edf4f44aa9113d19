"""Peak memory of the Zero Bubble paper's 1F1B and ZB-2p runs (its Table 4) against the paper's own figures.

The paper reports each run's peak memory beside its throughput: 30, 39, 32 and 43 GB for its 1.5B-28.3B
models under 1F1B. The zero-bubble profile prices attention eagerly because these figures say so: with eager
attention's saved scores the predictions land within a few GB; with FlashAttention they would come out a third to
nearly two thirds lower, which is how the profile's attention was chosen (simulators/frameworks/zero-bubble.yaml).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stageopt.frameworks import load_profile
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.validation import load_runs
from stageopt.validation.compare import prepare
from stageopt.workload import build_workload

RUNS = {r.id: r for r in load_runs(Path(__file__).resolve().parents[2] / "experiments" / "validation"
                                   / "published_runs.csv")}
TABLE_4_1F1B_GB = {"1.5B": 30, "6.2B": 39, "14.6B": 32, "28.3B": 43}
FEWEST_MICROBATCHES = {"1.5B": 24, "6.2B": 24, "14.6B": 48, "28.3B": 96}  # the first of Table 4's three columns


def _peak_gib(run, attention: str | None = None) -> float:
    prepared = prepare(run)
    work = prepared.work
    if attention is not None:
        stack = dataclasses.replace(load_profile(run.framework), attention=attention)
        plan = Plan.parse(run.plan, gpus=run.gpus, framework=stack)
        work = build_workload(work.model, plan, run.gpus)
    return AnalyticalSimulator().evaluate(work, prepared.hardware).peak_memory_gib


@pytest.mark.parametrize("model", list(TABLE_4_1F1B_GB))
def test_eager_attention_reproduces_the_papers_peak_memory(model):
    run = RUNS[f"ZB-T4-{model}-m{FEWEST_MICROBATCHES[model]}-1f1b"]
    measured = TABLE_4_1F1B_GB[model]
    predicted = _peak_gib(run)
    # The paper prints "GB" without saying GB or GiB; either way the prediction sits within 12%.
    assert predicted == pytest.approx(measured, rel=0.12)
    assert predicted * 2**30 / 1e9 == pytest.approx(measured, rel=0.12)


@pytest.mark.parametrize("model", list(TABLE_4_1F1B_GB))
def test_flash_attention_would_leave_a_third_or_more_unexplained(model):
    run = RUNS[f"ZB-T4-{model}-m{FEWEST_MICROBATCHES[model]}-1f1b"]
    assert _peak_gib(run, attention="flash") * 2**30 / 1e9 < 0.75 * TABLE_4_1F1B_GB[model]


TABLE_4_ZB2P_GB = {"1.5B": 59, "6.2B": 70, "14.6B": 51, "28.3B": 74}


@pytest.mark.parametrize("model", list(TABLE_4_ZB2P_GB))
def test_zb2p_doubles_the_activations_as_the_paper_measured(model):
    """ZB-2p holds up to 2p micro-batches (Table 4: 59-74 GB against 1F1B's 30-43). The schedule counts a
    micro-batch waiting for its weight gradient as a whole one against the limit, where the paper's search counts
    the smaller M_W, so it holds somewhat less: within 15% either way the unit is read."""
    m = FEWEST_MICROBATCHES[model]
    predicted = _peak_gib(RUNS[f"ZB-T4-{model}-m{m}-zb2p"])
    measured = TABLE_4_ZB2P_GB[model]
    assert predicted == pytest.approx(measured, rel=0.15)
    assert predicted * 2**30 / 1e9 == pytest.approx(measured, rel=0.15)
    assert predicted > _peak_gib(RUNS[f"ZB-T4-{model}-m{m}-1f1b"]) + 0.25 * measured
