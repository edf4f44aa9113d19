"""Benchmark: analytical evaluations per second, vectorized over candidate plans.

The space is Calculon's showcase (Isaev et al. 2023): a 530B GPT (105 layers, h=20480,
128 heads, seq 2048, gbs 2520... here 2560 so more plans divide) on up to 5,128 A100s, over
tp, pp, dp, micro-batch, interleaving, recompute, ZeRO and sequence parallelism.
Run: python experiments/benchmarks/bench_analytical.py
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from stageopt.errors import StageoptError
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_batch import evaluate_plans

GPUS = 5128


def candidate_plans(model) -> list[Plan]:
    plans = []
    for tp, pp, dp, mbs, vpp, rc, zero, sp in itertools.product(
            (1, 2, 4, 8), (1, 2, 3, 5, 7, 15, 21, 35, 105), range(1, 641), (1, 2, 4, 8), (1, 3, 5, 7),
            ("none", "selective", "full"), (0, 1), (False, True)):
        if tp * pp * dp > GPUS or (vpp > 1 and pp == 1):
            continue
        try:
            plan = Plan(tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=2560, vpp=vpp, recompute=rc, zero=zero, sp=sp,
                        schedule="interleaved" if vpp > 1 else "1f1b")
            validate_plan(plan, model)
        except StageoptError:
            continue
        plans.append(plan)
    return plans


def main() -> None:
    model = load_model("gpt3-175b", ["layers=105", "hidden=20480", "heads=128", "kv_heads=128", "ffn=81920"])
    hw = load_hardware("a100-80g")
    start = time.perf_counter()
    plans = candidate_plans(model)
    enum_s = time.perf_counter() - start
    evaluate_plans(model, hw, plans[:10])  # compile the blocks once
    start = time.perf_counter()
    result = evaluate_plans(model, hw, plans)
    eval_s = time.perf_counter() - start
    fits = result["mem_total"] <= hw.gpu.hbm_gib
    best = int(np.argmin(np.where(fits, result["iteration_time_s"], np.inf)))
    print(f"candidates (valid plans): {len(plans):,}  enumeration+validation {enum_s:.2f} s")
    print(f"analytical evaluation: {eval_s:.3f} s = {len(plans) / eval_s:,.0f} evaluations/s")
    print(f"fit in {hw.gpu.hbm_gib:g} GiB: {int(fits.sum()):,}; best: {plans[best]} "
          f"-> {result['iteration_time_s'][best]:.2f} s, MFU {result['mfu'][best]:.1%}")


if __name__ == "__main__":
    main()
