"""recipe_repeats: one plan on one machine in two releases whose FP8 scaling recipes differ, by hand."""

from __future__ import annotations

import pytest

from stageopt.validation import recipe_repeats
from test_precision_pairs import comparison  # same folder: pytest puts it on sys.path


def test_a_plan_in_two_releases_pairs_across_recipes_and_the_spelt_out_default_zero():
    """The older release ran 26 tokens/s (predicted 29), the newer 31 with current scaling (predicted 28): the
    newer one is measured 31/26 - 1 = 19.2% faster and predicted 28/29 - 1 = -3.4%. ``zero=1`` spelt out is the
    megatron-core default the older row leaves out; an identical repeat or another plan does not pair."""
    older = comparison("old", "tp=1 dp=8 mbs=2 gbs=128 dtype=fp8", 26.0, 29.0, source="A")
    newer = comparison("new", "tp=1 dp=8 mbs=2 gbs=128 zero=1 dtype=fp8 fp8_recipe=tensorwise", 31.0, 28.0)
    twin = comparison("twin", "tp=1 dp=8 mbs=2 gbs=128 zero=1 dtype=fp8 fp8_recipe=tensorwise", 30.0, 28.0)
    other = comparison("other", "tp=2 dp=4 mbs=2 gbs=128 dtype=fp8", 20.0, 20.0)
    [(rows, measured, predicted)] = recipe_repeats([older, newer, other])
    assert [c.run.id for c in rows] == ["old", "new"]
    assert measured == pytest.approx(31 / 26 - 1)
    assert predicted == pytest.approx(28 / 29 - 1)
    assert recipe_repeats([newer, twin, other]) == []
