"""Analytical model vs symmetric event replay on 20 plans; writes analytical_vs_replay.csv.

Both read the same graph; the replay executes the generated stage programs (the
exact schedule, dependencies and collectives the Chakra traces hold), the
analytical model uses closed forms. Run: python experiments/simulators/analytical_vs_replay.py
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload

HERE = Path(__file__).resolve().parent

PLANS = [
    ("llama3-8b", [], "tp=1 pp=1 mbs=1 gbs=16", 8, "h100-sxm"),
    ("llama3-8b", [], "tp=2 pp=2 mbs=1 gbs=32", 16, "h100-sxm"),
    ("llama3-8b", [], "tp=4 pp=1 mbs=2 gbs=64 zero=1 sp=on", 32, "h100-sxm"),
    ("llama3-8b", [], "tp=8 pp=2 mbs=1 gbs=64 zero=2 sp=on recompute=full", 64, "a100-80g"),
    ("llama3-8b", [], "tp=2 pp=4 cp=2 mbs=1 gbs=32 sp=on", 64, "h100-sxm"),
    ("llama3-70b", [], "tp=8 pp=4 mbs=1 gbs=128 zero=1 sp=on", 256, "h100-sxm"),
    ("llama3-70b", [], "tp=8 pp=4 mbs=1 gbs=128 zero=1 sp=on recompute=full", 256, "h100-sxm"),
    ("llama3-70b", [], "tp=8 pp=8 vpp=2 schedule=interleaved mbs=1 gbs=128 zero=1 sp=on", 512, "h100-sxm"),
    ("llama3-70b", [], "tp=4 pp=8 mbs=1 gbs=64 schedule=gpipe recompute=full framework=torchtitan", 256, "h100-sxm"),
    ("llama3-70b", [], "tp=8 pp=4 cp=2 mbs=1 gbs=64 zero=1 sp=on", 512, "h200-sxm"),
    ("llama3-70b", [], "tp=8 pp=2 mbs=1 gbs=64 zero=3 recompute=full sp=on", 256, "h100-sxm"),
    ("gpt3-175b", [], "tp=8 pp=8 mbs=1 gbs=128 recompute=full", 512, "a100-80g"),
    ("gpt3-175b", [], "tp=8 pp=12 mbs=1 gbs=96 recompute=full", 384, "a100-80g"),
    ("gpt3-175b", ["attention=eager", "dropout=true"], "tp=8 pp=8 mbs=1 gbs=64 recompute=selective sp=on", 256, "a100-80g"),
    ("mixtral-8x7b", [], "tp=2 ep=4 pp=2 mbs=1 gbs=64 sp=on", 64, "h100-sxm"),
    ("mixtral-8x7b", [], "tp=1 ep=8 pp=4 mbs=1 gbs=128 zero=1 recompute=full", 128, "h100-sxm"),
    ("deepseek-v3", ["layers=16", "dense_layers=1"], "tp=2 ep=8 pp=4 mbs=1 gbs=64 zero=1 recompute=full sp=on", 256, "h100-sxm"),
    ("llama3-405b", ["layers=32"], "tp=8 pp=8 mbs=1 gbs=128 zero=1 sp=on recompute=full", 1024, "h100-sxm"),
    ("llama3-405b", ["layers=32"], "tp=8 pp=4 cp=4 mbs=1 gbs=32 zero=1 sp=on", 1024, "gb200-nvl72"),
    ("llama2-7b", [], "tp=1 pp=1 mbs=4 gbs=256 zero=2", 64, "mi300x"),
]


def main() -> None:
    rows = []
    print(f"{'model':<13} {'hw':<11} {'plan':<62} {'replay s':>9} {'analyt. s':>9} {'diff':>7} {'replay wall':>11}")
    for name, sets, plan_text, gpus, hw_name in PLANS:
        work = build_workload(load_model(name, sets), Plan.parse(plan_text, gpus=gpus), gpus)
        hw = load_hardware(hw_name)
        start = time.perf_counter()
        replay = ReplaySimulator().evaluate(work, hw).iteration_time_s
        wall = time.perf_counter() - start
        analytical = AnalyticalSimulator().evaluate(work, hw).iteration_time_s
        diff = 100 * (analytical / replay - 1)
        rows.append([name, hw_name, plan_text, gpus, replay, analytical, round(diff, 2), round(wall, 3)])
        print(f"{name:<13} {hw_name:<11} {plan_text:<62} {replay:9.3f} {analytical:9.3f} {diff:6.1f}% {wall:10.2f}s")
    within = sum(abs(r[6]) <= 5 for r in rows)
    print(f"{within}/{len(rows)} plans within 5%; mean |diff| {sum(abs(r[6]) for r in rows) / len(rows):.1f}%")
    with open(HERE / "analytical_vs_replay.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["model", "hardware", "plan", "gpus", "replay_s", "analytical_s", "diff_pct", "replay_wall_s"])
        out.writerows(rows)


if __name__ == "__main__":
    main()
