"""Benchmark: symmetric replay wall time vs GPU count (cost must not grow with dp).

Run: python experiments/benchmarks/bench_replay.py
Each case: build the workload and the stage programs, compute node times, replay.
"""

from __future__ import annotations

import time

from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload

CASES = [
    ("llama3-70b", "tp=8 pp=4 mbs=1 gbs=1024 zero=1 sp=on", 1024),
    ("llama3-70b", "tp=8 pp=4 mbs=1 gbs=4096 zero=1 sp=on", 4096),
    ("llama3-405b", "tp=8 pp=16 mbs=1 gbs=1024 zero=1 sp=on recompute=full", 2048),
    ("llama3-405b", "tp=8 pp=16 mbs=1 gbs=2048 zero=1 sp=on recompute=full", 16384),
    ("llama3-405b", "tp=8 pp=16 cp=2 mbs=1 gbs=2048 zero=1 sp=on recompute=full", 32768),
]


def main() -> None:
    hw = load_hardware("h100-sxm")
    ReplaySimulator().evaluate(build_workload(load_model("llama3-8b", ["layers=2"]), Plan.parse("tp=2")), hw)
    print(f"{'model':<12} {'gpus':>6} {'micro-batches':>13} {'wall s':>7} {'iteration s':>11}  plan")
    for name, plan_text, gpus in CASES:
        start = time.perf_counter()
        work = build_workload(load_model(name), Plan.parse(plan_text, gpus=gpus), gpus)
        est = ReplaySimulator().evaluate(work, hw)
        wall = time.perf_counter() - start
        print(f"{name:<12} {gpus:>6} {work.plan.microbatches:>13} {wall:>7.2f} {est.iteration_time_s:>11.2f}  {plan_text}")


if __name__ == "__main__":
    main()
