"""scale_pairs: rows of one source that differ only in data parallelism (weak scaling), by hand."""

from __future__ import annotations

import dataclasses

import pytest

from stageopt.validation import scale_pairs
from test_precision_pairs import comparison  # same folder: pytest puts it on sys.path


def at(gpus: int, c):
    return dataclasses.replace(c, run=dataclasses.replace(c.run, gpus=gpus))


def test_weak_scaling_runs_pair_with_the_smallest():
    small = at(8, comparison("s", "tp=1 dp=8 gbs=64", 100.0, 98.0))  # -2%
    big = at(64, comparison("b", "tp=1 dp=64 gbs=512", 90.0, 97.2))  # +8%
    bigger = at(512, comparison("x", "tp=1 dp=512 gbs=4096", 85.0, 85.0))  # 0%
    strong = at(64, comparison("t", "tp=1 dp=64 gbs=64", 50.0, 60.0))  # same batch over more GPUs: less work each
    other = at(64, comparison("o", "tp=1 dp=64 gbs=512", 90.0, 90.0, source="B"))
    pairs = scale_pairs([small, big, bigger, strong, other])
    assert sorted((a.run.id, b.run.id) for a, b, _ in pairs) == [("s", "b"), ("s", "x")]
    gaps = {b.run.id: gap for _, b, gap in pairs}
    assert gaps["b"] == pytest.approx(0.08 - (-0.02))
    assert gaps["x"] == pytest.approx(0.0 - (-0.02))
