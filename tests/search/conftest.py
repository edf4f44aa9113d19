"""Shared helpers for the search tests: the small space, an independent brute-force optimum, the CLI."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stageopt.errors import StageoptError
from stageopt.hardware import apply_hw_overrides, load_hardware
from stageopt.model import load_model
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_batch import evaluate_plans

HERE = Path(__file__).resolve().parent
SMALL = HERE / "spaces" / "small.yaml"
REPO = HERE.parents[1]


def brute_force_small(hw_set: tuple[str, ...] = ()) -> tuple[int, float, str]:
    """(feasible plan count, best time, best plan) of spaces/small.yaml, enumerated without stageopt.search."""
    model = load_model("llama3-8b", ["seq=4096"])
    hw = apply_hw_overrides(load_hardware("h100-sxm"), list(hw_set))
    plans = []
    for tp, pp, mbs, zero, rc in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2), (0, 1), ("none", "full")):
        try:
            plan = Plan(tp=tp, pp=pp, dp=64 // (tp * pp), mbs=mbs, gbs=128, zero=zero, recompute=rc, sp=True)
            validate_plan(plan, model, 64)
        except StageoptError:
            continue
        plans.append(plan)
    res = evaluate_plans(model, hw, plans)
    usable = hw.gpu.hbm_gib - (2.0 + 0.03 * hw.gpu.hbm_gib)  # the documented default reserve
    t = np.where(res["mem_total"] <= usable, res["iteration_time_s"], np.inf)
    i = int(np.argmin(t))
    return int(np.isfinite(t).sum()), float(t[i]), str(plans[i])


def run_cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    return subprocess.run([sys.executable, "-m", "stageopt.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)


def search_json(*args: str, **kw) -> dict:
    proc = run_cli("search", "--json", "--no-plots", *args, **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"
