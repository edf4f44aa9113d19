"""Generated trace sets shared by the generate tests (one per matrix case, made once)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.program import ProgramOptions
from stageopt.program.generate import generate
from stageopt.workload import Workload, build_workload

Case = tuple[tuple[str, tuple[str, ...]], str, int, str]


def workload_of(case: Case) -> Workload:
    (name, sets), plan, gpus, _bucket = case
    return build_workload(load_model(name, list(sets)), Plan.parse(plan, gpus=gpus), gpus)


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Case], tuple[Workload, Path]]:
    """Generate a case's full trace set once per session; returns (workload, directory)."""
    hw = load_hardware("h100-sxm")
    cache: dict[Case, tuple[Workload, Path]] = {}

    def get(case: Case) -> tuple[Workload, Path]:
        if case not in cache:
            work = workload_of(case)
            out = tmp_path_factory.mktemp("gen")
            generate(work, hw, out, options=ProgramOptions(bucket=case[3]))
            cache[case] = (work, out)
        return cache[case]

    return get
