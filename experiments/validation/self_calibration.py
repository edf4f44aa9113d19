"""What a user can expect after calibrating to their own cluster: each source's runs through ``stageopt calibrate``.

A source (one stack and cluster, one hardware preset) plays the user: its rows
are written as a measurements CSV, the user's command fits the hardware file to
them, and every model's runs are held out of the fit in turn (a new model on a
calibrated cluster; sources with one model hold out one run at a time). Prints,
per source, the throughput MAPE with the shipped preset, calibrated in-sample
and held out, and writes ``self_calibration.csv`` beside this script.

Run: python experiments/validation/self_calibration.py [--exact]   (a few minutes)
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from collections import defaultdict
from pathlib import Path

from stageopt.cli import build_parser
from stageopt.commands.calibrate_command import calibrate
from stageopt.errors import StageoptError
from stageopt.validation import load_runs

HERE = Path(__file__).resolve().parent
MIN_ROWS = 5


def measured_csv(rows, path: Path) -> None:
    """The rows as a user's measurements file, grouped by model (each run alone where there is one model)."""
    models = {_model_name(r) for r in rows}
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "model", "set", "plan", "gpus", "framework", "hw_set", "metric", "value", "group",
                      "flops_formula"])
        for r in rows:
            group = _model_name(r) if len(models) > 1 else r.id
            out.writerow([r.id, r.model, " ".join(r.model_set), r.plan, r.gpus, r.framework, " ".join(r.hw_set),
                          r.metric, r.value, group, r.flops_formula or "megatron"])


def _model_name(run) -> str:
    """A short name for a row's model: the preset and its width (``llama3-8b/h8192``)."""
    hidden = next((item.split("=", 1)[1] for item in run.model_set if item.startswith("hidden=")), "")
    return f"{run.model}/h{hidden}" if hidden else run.model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exact", action="store_true", help="refit for every held-out group")
    exact = parser.parse_args().exact
    groups = defaultdict(list)
    for run in load_runs(HERE / "published_runs.csv"):
        if run.expressible:
            groups[(run.source, run.hardware)].append(run)
    results = []
    print(f"{'source':<40} {'hardware':<16} {'rows':>4} {'preset':>7} {'fitted':>7} {'held out':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for (source, hardware), rows in sorted(groups.items()):
            if len(rows) < MIN_ROWS:
                continue
            path = Path(tmp) / "measured.csv"
            measured_csv(rows, path)
            argv = ["calibrate", str(path), "--hardware", hardware, "--out", str(Path(tmp) / "hw.yaml")]
            try:
                report = calibrate(build_parser().parse_args(argv + (["--exact"] if exact else [])))[0]
            except StageoptError as err:
                print(f"{source:<40} {hardware:<16} {len(rows):>4}  skipped: {err}")
                continue
            line = {"source": source, "hardware": hardware, "rows": len(rows), "preset": report["mape_preset"],
                    "calibrated": report["mape_calibrated"], "held_out": report["mape_held_out"],
                    "fitted": " ".join(f"{k.removeprefix('gpu.efficiency.')}={float(v):.3g}"
                                       for k, v in report["fitted"].items())}
            results.append(line)
            print(f"{source:<40} {hardware:<16} {len(rows):>4} {line['preset']:>6.1f}% {line['calibrated']:>6.1f}% "
                  f"{line['held_out']:>8.1f}%")
    rows = sum(r["rows"] for r in results)
    for key in ("preset", "calibrated", "held_out"):
        print(f"  row-weighted {key:<11} {sum(r[key] * r['rows'] for r in results) / rows:5.1f}%  ({rows} rows)")
    with open(HERE / "self_calibration.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(results[0]))
        out.writeheader()
        out.writerows({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()} for r in results)


if __name__ == "__main__":
    main()
