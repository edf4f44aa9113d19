"""Benchmark ``stageopt validate-trace`` on the sets ``bench_generate.py`` writes (issue 16: 32K ranks in < 30 s).

For each size: generate the set (as ``stageopt generate`` does), then validate
it in a fresh process by symmetric class (the default) and print wall time,
CPU time (user + system, children included), peak RSS, and how many files
were decoded node by node. ``--every-file`` also times the file-by-file check
(``validate-trace --every-file``) on the same set, for comparison; it takes
minutes at 1,024 ranks and more. Sets are deleted afterwards (32,768 ranks
take ~1.5 GB) unless ``--keep DIR`` is given.

    python experiments/benchmarks/bench_validate.py [--sizes 1024,32768] [--every-file] [--keep DIR]

Target (2 cores): 32,768 ranks in under 30 s. The machine's load is printed
with each row, since wall time on a shared machine depends on it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SIZES = {  # the same sets as bench_generate.py
    1024: ("llama3-70b", "dp=32 tp=8 pp=4"),
    32768: ("llama3-70b", "dp=256 tp=8 pp=16 gbs=512"),
}


def _cli(*args: str) -> tuple[float, float, str]:
    """Run ``stageopt ARGS`` in a fresh process; (wall s, CPU s of the child, stdout)."""
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "stageopt.cli", *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"stageopt {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, proc.stdout


def _peak_rss_mb(args: list[str]) -> float:
    """Peak RSS of one run, read from GNU time when it is installed (else nan)."""
    if not shutil.which("time") and not os.path.exists("/usr/bin/time"):
        return float("nan")
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "stageopt.cli", *args],
                          capture_output=True, text=True)
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return int(last) / 1024 if last.isdigit() else float("nan")


def bench(gpus: int, root: str, every_file: bool) -> None:
    model, plan = SIZES[gpus]
    out = os.path.join(root, f"gpus{gpus}")
    shutil.rmtree(out, ignore_errors=True)
    gen_wall, _, _ = _cli("generate", "--model", model, "--plan", plan, "--gpus", str(gpus),
                          "--hardware", "h100-sxm", "--out", out, "--progress", "off")
    size_mb = sum(e.stat().st_size for e in os.scandir(out)) / 1e6
    rows = [("by class", [])] + ([("every file", ["--every-file"])] if every_file else [])
    for label, extra in rows:
        load = os.getloadavg()[0]
        wall, cpu, text = _cli("validate-trace", out, *extra)
        full = re.search(r"checked node by node: (\d+)", text)
        verdict = text.splitlines()[0].split(": ", 1)[1].split(" —")[0]
        rss = _peak_rss_mb(["validate-trace", out, *extra]) if label == "by class" else float("nan")
        print(f"{gpus:>6} {label:<11} {verdict:<8} {wall:>8.1f} {cpu:>8.1f} {rss:>9.0f} "
              f"{full.group(1) if full else '?':>10} {size_mb:>9.0f} {gen_wall:>9.1f} {load:>6.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,32768", help="comma-separated rank counts (1024, 32768)")
    ap.add_argument("--every-file", action="store_true", help="also time the file-by-file check")
    ap.add_argument("--keep", default=None, help="write the sets under this folder and keep them")
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="bench_validate_")
    print(f"{'ranks':>6} {'mode':<11} {'verdict':<8} {'wall s':>8} {'CPU s':>8} {'RSS MB':>9} {'full files':>10} "
          f"{'set MB':>9} {'gen s':>9} {'load':>6}")
    try:
        for gpus in (int(s) for s in args.sizes.split(",")):
            bench(gpus, root, args.every_file)
            if not args.keep:
                shutil.rmtree(os.path.join(root, f"gpus{gpus}"), ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
