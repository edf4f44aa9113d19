"""Predicted vs published serving measurements, through `stageopt serve`'s path.

Every row of serving_runs.csv (beside this script) is what a user would type:
a model preset, a serving plan string, a traffic string, a hardware preset.
Predictions come from `stageopt.serving.deployment.serve_plan`, the function
behind `stageopt serve`, with nothing else set per row. Throughput compares
the simulated run's output tokens/s (what the benchmark measures over its
run); TPOT and TTFT compare the simulated means (the sources report averages).

Prints MAPE and the mean signed error (positive: predicted higher than
measured) per source and metric; writes serving_results.csv beside this script.

Run: python experiments/validation/serving_validation.py [serving_runs.csv] [--hw-set KEY=VALUE ...]

``--hw-set`` applies the same hardware override to every row (a what-if on a
physical parameter, e.g. the HBM fraction a streaming kernel reaches); the
figures it prints are labelled as such and written to serving_results_whatif.csv.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import defaultdict
from pathlib import Path

from stageopt.serving.deployment import serve_plan

HERE = Path(__file__).resolve().parent
GOAL_METRICS = ("output_tokens_per_s", "tpot_ms")


def predicted(est, metric: str) -> float:
    if metric == "output_tokens_per_s":
        return est.output_tokens_per_s
    return est.sim.mean(metric.removesuffix("_ms")) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description="Predicted vs published serving throughput and latency.")
    parser.add_argument("runs", nargs="?", type=Path, default=HERE / "serving_runs.csv",
                        help="CSV of published serving runs (default: serving_runs.csv beside this script)")
    parser.add_argument("--hw-set", action="append", default=[], metavar="KEY=VALUE",
                        help="what-if: override a hardware field on every row (repeatable)")
    args = parser.parse_args()
    overrides, path = args.hw_set, args.runs
    if not path.is_file():
        parser.error(f"runs file {path} not found; give the path of a serving-runs CSV")
    rows = list(csv.DictReader(path.open()))
    if overrides:
        print(f"WHAT-IF: every row with --hw-set {' '.join(overrides)}")
    cache: dict[tuple, object] = {}
    out = []
    start = time.monotonic()
    for r in rows:
        key = (r["model"], r["model_set"], r["plan"], r["traffic"], r["hardware"], r["hw_set"])
        if key not in cache:
            cache[key] = serve_plan(r["model"], r["plan"], r["traffic"], hardware=r["hardware"],
                                    model_set=r["model_set"].split(), hw_set=r["hw_set"].split() + overrides)
        pred = predicted(cache[key], r["metric"])
        measured = float(r["value"])
        out.append({**{k: r[k] for k in ("id", "source", "hardware", "plan", "traffic", "metric")},
                    "measured": measured, "predicted": round(pred, 3),
                    "error_pct": round(100 * (pred - measured) / measured, 1)})
    with open(HERE / ("serving_results_whatif.csv" if overrides else "serving_results.csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for o in out:
        groups[(o["source"], o["metric"])].append(o["error_pct"])
    print(f"{'source':<30} {'metric':<22} {'rows':>4} {'MAPE':>7} {'signed':>7}")
    for (source, metric), errs in sorted(groups.items()):
        flag = "" if metric in GOAL_METRICS else "  (not in the goal)"
        print(f"{source:<30} {metric:<22} {len(errs):>4} {sum(map(abs, errs)) / len(errs):>6.1f}% "
              f"{sum(errs) / len(errs):>+6.1f}%{flag}")
    for metric in GOAL_METRICS:
        errs = [o["error_pct"] for o in out if o["metric"] == metric]
        if errs:
            print(f"{'all sources':<30} {metric:<22} {len(errs):>4} {sum(map(abs, errs)) / len(errs):>6.1f}%")
    print(f"{len(cache)} deployments simulated in {time.monotonic() - start:.0f} s; rows in serving_results.csv")


if __name__ == "__main__":
    main()
