"""Predicted vs published TFLOP/s per GPU for every row of published_runs.csv.

Writes experiments/validation/results.csv (per-row prediction and error) and
parity.png, and prints MAPE per source and overall.
Run: python experiments/validation/run_validation.py [path/to/published_runs.csv]
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from stageopt.validation import load_cases, mape, predict

HERE = Path(__file__).resolve().parent
DEFAULT_CSV = HERE.parents[2] / "shared" / "validation" / "published_runs.csv"


def main() -> None:
    cases = load_cases(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CSV)
    pred = predict(cases)
    measured = np.array([c.measured_tflops for c in cases])
    with open(HERE / "results.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "source", "hardware", "plan", "measured_tflops", "predicted_tflops", "error_pct"])
        for c, p in zip(cases, pred):
            out.writerow([c.id, c.source, c.hardware, str(c.plan), c.measured_tflops, round(float(p), 1),
                          round(100 * (p / c.measured_tflops - 1), 1)])
    for source in sorted({c.source for c in cases}):
        idx = [i for i, c in enumerate(cases) if c.source == source]
        print(f"{source:<22} {len(idx):>3} rows  MAPE {mape(pred[idx], measured[idx]):5.1f}%")
    print(f"{'all':<22} {len(cases):>3} rows  MAPE {mape(pred, measured):5.1f}%")
    _plot(cases, pred, measured)


def _plot(cases, pred, measured) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipped parity.png (pip install -e '.[plots]')")
        return
    fig, ax = plt.subplots(figsize=(5, 5))
    for source, marker in (("Megatron-LM 2021", "o"), ("Megatron-Core H100", "s")):
        idx = [i for i, c in enumerate(cases) if c.source == source]
        ax.scatter(measured[idx], pred[idx], marker=marker, label=source)
    top = max(measured.max(), pred.max()) * 1.1
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10%")
    ax.set_xlabel("published TFLOP/s per GPU")
    ax.set_ylabel("stageopt analytical TFLOP/s per GPU")
    ax.set_title(f"Validation: MAPE {mape(pred, measured):.1f}% over {len(cases)} runs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "parity.png", dpi=120)


if __name__ == "__main__":
    main()
