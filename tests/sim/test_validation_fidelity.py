"""Fidelity regression: the analytical model vs published Megatron-LM measurements."""

from pathlib import Path

import numpy as np
import pytest

from stageopt.validation import load_cases, mape, predict

CSV = Path(__file__).resolve().parents[2].parent / "shared" / "validation" / "published_runs.csv"


@pytest.fixture(scope="module")
def cases():
    if not CSV.is_file():
        pytest.skip("../shared/validation/published_runs.csv not present")
    return load_cases(CSV)


def test_mape_per_source_is_within_ten_percent(cases):
    pred = predict(cases)
    measured = np.array([c.measured_tflops for c in cases])
    assert mape(pred, measured) <= 10.0
    for source in {c.source for c in cases}:
        idx = [i for i, c in enumerate(cases) if c.source == source]
        assert mape(pred[idx], measured[idx]) <= 10.0, source


def test_zero3_slows_down_as_dp_grows_like_the_paper(cases):
    """Table 2: at fixed global batch, ZeRO-3 throughput per GPU falls as GPUs are added."""
    rows = [c for c in cases if c.id.startswith("MEG21-T2-ZeRO-3-174B")]
    pred = predict(rows)
    assert list(pred) == sorted(pred, reverse=True)
