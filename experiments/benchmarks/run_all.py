"""All the figures the README quotes, in one command (2-core machine: about 3 minutes).

Runs each benchmark script in its own process and prints its table:
inspect wall time, trace generation (8 -> 32,768 GPUs), trace validation (1,024 and
32,768 ranks), analytical evaluations per second, replay time vs GPU count, and
`stageopt search --budget 500` wall time.
Run: python experiments/benchmarks/run_all.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_inspect.py", "bench_generate.py", "bench_validate.py", "bench_analytical.py", "bench_replay.py"]


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def main() -> None:
    for script in SCRIPTS:
        section(script)
        subprocess.run([sys.executable, str(HERE / script)], check=True)
    section("stageopt search --budget 500 (default space, analytical, fresh process)")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "stageopt.cli", "search", "--budget", "500"], cwd=tmp,
                             capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - start
    print(out.splitlines()[0])
    print(f"wall time including interpreter start and imports: {wall:.1f} s")


if __name__ == "__main__":
    main()
