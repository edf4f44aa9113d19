"""Benchmark ``stageopt generate`` at 8, 1,024 and 32,768 GPUs (issue 3's targets).

Each size runs in a fresh Python process (so peak RSS and wall time are the
size's own) and prints: wall time from the start of the process's work
(imports, model loading, graph compilation, writing: what a user running
``stageopt generate`` waits for, less the interpreter start), the same
without the imports, peak RSS, bytes written and file count. Trace sets go to a temporary folder that is
removed afterwards unless ``--keep DIR`` is given.

    python experiments/benchmarks/bench_generate.py [--sizes 8,1024,32768] [--keep DIR]

Targets (2 cores): 8 GPUs <= 1 s, 1,024 GPUs <= 3 s, 32,768 GPUs <= 60 s with
peak RSS <= 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

SIZES = {
    8: ("llama3-70b", "dp=2 tp=2 pp=2", 1.0),
    1024: ("llama3-70b", "dp=32 tp=8 pp=4", 3.0),
    32768: ("llama3-70b", "dp=256 tp=8 pp=16 gbs=512", 60.0),  # two micro-batches per pipeline
}


def _child(gpus: int, out: str) -> None:
    """Run one generation in this process and print one JSON line."""
    start = time.perf_counter()
    from stageopt.cli import build_parser, main

    build_parser()  # imports every command module (sympy, protobuf, numpy): ~0.7 s of a small run
    imported = time.perf_counter()
    model, plan, _ = SIZES[gpus]
    rc = main(["generate", "--model", model, "--plan", plan, "--gpus", str(gpus), "--hardware", "h100-sxm",
               "--out", out, "--progress", "off"])
    end = time.perf_counter()
    wall, after_imports = end - start, end - imported
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    traces = [e for e in os.scandir(out) if e.name.endswith(".et")]
    total = sum(e.stat().st_size for e in os.scandir(out))
    print(json.dumps({"rc": rc, "wall_s": wall, "after_imports_s": after_imports, "peak_rss_mb": rss_kib / 1024, "bytes": total,
                      "trace_files": len(traces), "files": len(os.listdir(out))}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated GPU counts")
    ap.add_argument("--keep", default=None, help="write the sets under this folder and keep them")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.out)
        return
    root = args.keep or tempfile.mkdtemp(prefix="bench_generate_")
    print(f"{'GPUs':>6} {'plan':<28} {'wall s':>8} {'target':>7} {'w/o imports':>12} {'peak RSS MB':>12} "
          f"{'MB written':>11} {'files':>6}")
    try:
        for gpus in (int(s) for s in args.sizes.split(",")):
            out = os.path.join(root, f"gpus{gpus}")
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--child", str(gpus), "--out", out],
                                  capture_output=True, text=True, check=True)
            outer = time.perf_counter() - start
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            model, plan, target = SIZES[gpus]
            print(f"{gpus:>6} {plan:<28} {res['wall_s']:>8.2f} {target:>7.0f} {res['after_imports_s']:>12.2f} "
                  f"{res['peak_rss_mb']:>12.0f} "
                  f"{res['bytes'] / 1e6:>11.1f} {res['files']:>6}   (process incl. interpreter start: {outer:.2f} s)",
                  flush=True)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
