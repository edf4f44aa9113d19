"""Benchmark: `stageopt inspect` wall time and peak RSS, and that cost does not grow with dp.

Run: python experiments/benchmarks/bench_inspect.py
Each case runs in a fresh process (imports, graph build and compile included).
"""

from __future__ import annotations

import subprocess
import sys
import time

CASES = [
    ("llama3-405b", "tp=8 pp=16 cp=2 mbs=1 gbs=2048 sp=on zero=1 recompute=full", 1024),
    ("llama3-405b", "tp=8 pp=16 cp=2 mbs=1 gbs=2048 sp=on zero=1 recompute=full", 16384),
    ("gpt3-175b", "tp=8 pp=8 mbs=1 gbs=1536 recompute=full", 1536),
    ("mixtral-8x7b", "tp=2 ep=8 pp=4 mbs=1 gbs=1024 sp=on", 512),
    ("deepseek-v3", "tp=1 ep=64 pp=16 mbs=1 gbs=4096 zero=1 recompute=full", 2048),
]

CODE = """
import resource, sys, time
t = time.perf_counter()
from stageopt.cli import main
import io, contextlib
with contextlib.redirect_stdout(io.StringIO()):
    main(["inspect", "--model", sys.argv[1], "--plan", sys.argv[2], "--gpus", sys.argv[3], "--json"])
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def main() -> None:
    print(f"{'model':<14} {'gpus':>6}  {'wall s':>7} {'peak RSS MB':>11}  plan")
    for model, plan, gpus in CASES:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CODE, model, plan, str(gpus)],
                             capture_output=True, text=True, check=True).stdout.split()
        wall = time.perf_counter() - start
        print(f"{model:<14} {gpus:>6}  {wall:>7.2f} {float(out[1]):>11.0f}  {plan}")


if __name__ == "__main__":
    main()
