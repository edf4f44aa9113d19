"""Parameter counts derived from the graph vs published model sizes."""

import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload


def _params(name: str, plan: str = "tp=1") -> tuple[float, float]:
    work = build_workload(load_model(name), Plan.parse(plan))
    return work.params_total, work.params_active


@pytest.mark.parametrize("name, published", [
    ("gpt3-175b", 174.6e9),   # Narayanan et al. 2021, Table 1 / Brown et al. 2020
    ("llama3-70b", 70.6e9),   # Meta model card
    ("llama3-405b", 405.8e9),  # Meta model card
    ("mixtral-8x7b", 46.7e9),  # Jiang et al. 2024
    ("llama2-7b", 6.74e9),
    ("llama3-8b", 8.03e9),
])
def test_total_parameters_match_published(name, published):
    total, _ = _params(name)
    assert total == pytest.approx(published, rel=0.005)


def test_mixtral_active_parameters():
    total, active = _params("mixtral-8x7b")
    assert active == pytest.approx(12.9e9, rel=0.005)
    assert total == pytest.approx(46.7e9, rel=0.005)


def test_deepseek_v3_is_close_to_671b_with_mla_approximated():
    total, active = _params("deepseek-v3")
    assert total == pytest.approx(671e9, rel=0.01)
    assert active == pytest.approx(37e9, rel=0.06)


def test_closed_form_llama_layer_count():
    """12-term closed form for a Llama layer: attention 2h^2 + 2h*kv*d, MLP 3h*f, two norms."""
    m = load_model("llama3-70b")
    d = m.hidden // m.heads
    per_layer = 2 * m.hidden**2 + 2 * m.hidden * m.kv_heads * d + 3 * m.hidden * m.ffn + 2 * m.hidden
    expected = m.layers * per_layer + 2 * m.vocab * m.hidden + m.hidden
    total, _ = _params("llama3-70b")
    assert total == expected


def test_params_do_not_depend_on_the_plan():
    a, _ = _params("llama3-70b", "tp=8 pp=4")
    b, _ = _params("llama3-70b", "tp=2 pp=8 cp=2")
    assert a == b
