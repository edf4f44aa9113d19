"""Predicted peak memory per GPU vs published peak memory of rows in ``published_runs.csv``.

The default reference is torchtitan's end-of-2024 H100 benchmark: its
``benchmarks/llama3_h100_202412_torchtitan.md`` gives, beside each
throughput row of ``published_runs.csv`` (ids ``TT2412-*``), the memory its
logger printed: the caching allocator's peak *reserved* bytes, the maximum over
all GPUs. Reserved memory includes what the allocator keeps cached and
fragmented, so a tensor-exact prediction should sit somewhat below it. The rows
run through the same path as the throughput validation
(:func:`stageopt.validation.compare.prepare`, the analytical backend).

Another reference file of the same columns (id, measured_gib, table, citation) may be given instead:
``memory_zero_bubble.csv`` holds the Zero Bubble paper's Memory (GB) rows (its Tables 4 and 6).

Run: python experiments/validation/memory_torchtitan.py [memory_zero_bubble.csv]
     (writes <reference>_results.csv beside it; default memory_torchtitan.csv)
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from stageopt.errors import StageoptError
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.validation import load_runs
from stageopt.validation.compare import prepare

HERE = Path(__file__).resolve().parent


def main() -> None:
    reference = HERE / (sys.argv[1] if len(sys.argv) > 1 else "memory_torchtitan.csv")
    runs = {r.id: r for r in load_runs(HERE / "published_runs.csv")}
    rows, errors = [], []
    print(f"{'run':<46} {'measured':>9} {'predicted':>9} {'error':>7}  breakdown (GiB)")
    for ref in csv.DictReader(open(reference)):
        run = runs[ref["id"]]
        measured = float(ref["measured_gib"])
        if not run.expressible:
            print(f"{run.id:<46} {measured:>9.1f}  not expressible: {run.status}")
            continue
        try:
            prepared = prepare(run)
        except StageoptError as err:
            print(f"{run.id:<46} {measured:>9.1f}  refused: {err}")
            continue
        est = AnalyticalSimulator().evaluate(prepared.work, prepared.hardware)
        error = est.peak_memory_gib / measured - 1
        errors.append(error)
        parts = "  ".join(f"{k} {v:.1f}" for k, v in est.memory_breakdown_gib.items())
        print(f"{run.id:<46} {measured:>9.1f} {est.peak_memory_gib:>9.1f} {100 * error:>+6.1f}%  {parts}")
        rows.append([run.id, ref["table"], measured, f"{est.peak_memory_gib:.2f}", f"{100 * error:+.1f}"])
    print(f"\n{len(errors)} rows: mean |error| {100 * sum(abs(e) for e in errors) / len(errors):.1f}%, "
          f"mean signed {100 * sum(errors) / len(errors):+.1f}% (negative: predicted below the reserved peak)")
    with open(reference.with_name(reference.stem + "_results.csv"), "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "table", "measured_reserved_gib", "predicted_peak_gib", "error_pct"])
        out.writerows(rows)


if __name__ == "__main__":
    main()
