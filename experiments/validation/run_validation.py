"""Predicted vs published throughput for every row of published_runs.csv, through `stageopt simulate`'s path.

Prints, per source, the rows simulated, MAPE and mean signed error (positive:
predicted faster than measured); overall figures; rank correlation and top-1
regret within each family of plans; setups published more than once and the
error floor their spread sets; the published runs whose predicted memory
exceeds the GPU (they ran, so each is a memory-model miss a search would act
on: it would discard that plan); rows measured under a software regression the
stack's maintainers acknowledge (simulated and shown, kept out of every figure);
and the rows that cannot be expressed yet.
Writes results.csv (one line per row) and parity.png beside this script.

Run: python experiments/validation/run_validation.py [published_runs.csv]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from stageopt.validation import (family_ranking, load_runs, mape, precision_pairs, predict_all, recipe_repeats,
                                 repeated_setups, scale_pairs)
from stageopt.validation.compare import by_key, predict

HERE = Path(__file__).resolve().parent


def write_results(comps, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "source", "family", "metric", "measured", "predicted", "error_pct", "plan", "framework",
                      "hardware", "free_gib"])
        for c in comps:
            r = c.run
            out.writerow([r.id, r.source, r.family, r.metric, r.value, f"{c.predicted:.4g}", f"{100 * c.error:+.1f}",
                          r.plan, r.framework, r.hardware, f"{c.free_gib:.1f}"])


def parity_plot(comps, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("parity.png skipped: matplotlib is not installed (pip install 'stageopt[plots]')")
        return
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for source, group in sorted(by_key(comps, lambda c: c.run.source).items()):
        ax.scatter([1.0] * len(group), [c.throughput_ratio for c in group], s=0)  # keep colours stable
        ax.scatter([c.measured for c in group], [c.measured * c.throughput_ratio for c in group], s=14, label=source)
    ax.set_xscale("log"), ax.set_yscale("log")
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.set_xlabel("measured (source metric, throughput-like)"), ax.set_ylabel("predicted")
    ax.legend(fontsize=5.5, ncol=2, loc="upper left")
    ax.set_title(f"{len(comps)} published runs, MAPE {mape(comps):.1f}%")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def print_gaps(pairs, heading: str, key, width: int, spans: bool = False) -> None:
    """Pairs of rows (base, other, gap in error) summed up per ``key`` of the other row."""
    if not pairs:
        return
    print(f"\n{len(pairs)} {heading}")
    for name in sorted({key(other) for _, other, _ in pairs}):
        group = [(base, other, 100 * gap) for base, other, gap in pairs if key(other) == name]
        gaps = [gap for _, _, gap in group]
        span = f" ({group[0][0].run.gpus}->{group[0][1].run.gpus} .. {group[-1][0].run.gpus}->{group[-1][1].run.gpus}" \
            " GPUs)" if spans else ""
        print(f"  {name[:width]:<{width}} {len(gaps):>3}  gap mean {sum(gaps) / len(gaps):+5.1f} pts, "
              f"from {min(gaps):+5.1f} to {max(gaps):+5.1f}{span}")


def print_groups(groups, heading: str, columns: tuple[str, str], signed: bool) -> None:
    """Groups of rows with two percentages each (``groups`` as :func:`repeated_setups` returns them)."""
    print(f"\n{len(groups)} {heading}")
    print(f"  {'rows':<70} {columns[0]:>9} {columns[1]:>9}")
    sign = "+" if signed else ""
    for rows, first, second in groups:
        ids = ", ".join(c.run.id for c in rows)
        print(f"  {ids[:70]:<70} {100 * first:>{sign}8.1f}% {100 * second:>{sign}8.1f}%")


def print_repeats(comps) -> None:
    """Setups published more than once (successive releases): what no single prediction can fit; and those whose
    rows differ only in the FP8 scaling recipe, with how much of the measured change the model follows."""
    repeats = repeated_setups(comps)
    if repeats:
        print_groups(repeats, "setups measured more than once (same model, plan, profile, hardware):",
                     ("spread", "floor"), signed=False)
        in_repeats = sum(len(rows) for rows, _, _ in repeats)
        floor_all = sum(len(rows) * floor for rows, _, floor in repeats) / len(comps)
        print(f"  these {in_repeats} rows alone keep the all-rows MAPE at or above {100 * floor_all:.1f}%")
    recipes = recipe_repeats(comps)
    if recipes:
        print_groups(recipes, "setups measured in more than one release, the FP8 scaling recipe aside (slowest "
                     "first):", ("measured", "predicted"), signed=True)


def print_regressed(runs) -> None:
    """Rows measured under an acknowledged software regression: simulated as the stack should run, shown with
    their error and the issue that names the regression, and kept out of every figure above."""
    if not runs:
        return
    rows = "row" if len(runs) == 1 else "rows"
    print(f"\n{len(runs)} {rows} measured under a software regression its maintainers acknowledge (not in the MAPE):")
    for run in runs:
        c = predict(run)  # the row's status does not change how it is simulated
        print(f"  {run.id:<44} {100 * c.error:+7.1f}%  {run.status[len('regression:'):].strip()[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Predicted vs published throughput of every published run.")
    parser.add_argument("runs", nargs="?", type=Path, default=HERE / "published_runs.csv",
                        help="CSV of published runs (default: published_runs.csv beside this script)")
    path = parser.parse_args().runs
    if not path.is_file():
        parser.error(f"runs file {path} not found; give the path of a published-runs CSV")
    try:
        runs = load_runs(path)
    except (ValueError, KeyError) as err:
        parser.error(f"{path}: {err}")
    comps, refused = predict_all(runs)
    print(f"{'source':<40} {'rows':>4} {'MAPE':>7} {'signed':>7}")
    for source, group in sorted(by_key(comps, lambda c: c.run.source).items()):
        signed = 100 * sum(c.error for c in group) / len(group)
        print(f"{source:<40} {len(group):>4} {mape(group):>6.1f}% {signed:>+6.1f}%")
    print(f"{'all':<40} {len(comps):>4} {mape(comps):>6.1f}%")
    print(f"\n{'family':<32} {'runs':>4} {'rho':>6} {'top-1 regret':>13}")
    for name, (n, rho, regret) in sorted(family_ranking(comps).items()):
        print(f"{name:<32} {n:>4} {rho:>6.2f} {100 * regret:>12.1f}%")
    print_repeats(comps)
    # same source and plan in BF16 and in FP8: a gap between their errors is a precision-specific miss
    print_gaps(precision_pairs(comps), "plans measured in BF16 and in low precision by one source (gap: low-precision "
               "error minus BF16 error):", lambda c: c.run.hardware, 16)
    # same source and plan at several data-parallel sizes: a gap growing with the GPU count is a cost of scale
    print_gaps(scale_pairs(comps), "runs measured beside a smaller run of the same plan and source, dp alone larger "
               "(gap: larger run's error minus the smaller's; positive: it slowed with scale more than predicted):",
               lambda c: c.run.source, 38, spans=True)
    misses = [c for c in comps if c.free_gib < 0]
    print(f"\n{len(misses)} of {len(comps)} published runs predicted not to fit their GPU's memory:")
    for c in sorted(misses, key=lambda c: c.free_gib):
        print(f"  {c.run.id:<44} over by {-c.free_gib:6.1f} GiB")
    regressed = [run for run, _ in refused if run.regressed]
    print_regressed(regressed)
    refused = [(run, why) for run, why in refused if not run.regressed]
    print(f"\n{len(refused)} of {len(runs)} rows not expressible yet:")
    reasons: dict[str, int] = {}
    for _, why in refused:
        reasons[why] = reasons.get(why, 0) + 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>3}  {why}")
    write_results(comps, HERE / "results.csv")
    parity_plot(comps, HERE / "parity.png")


if __name__ == "__main__":
    main()
