"""Fit each GPU family's kernel-model parameters to the published runs, with leave-one-source-out checks.

For every family (A100, Hopper = H100/H200, Blackwell = B200/GB200) this fits
the parameters of :data:`stageopt.validation.calibrate.PARAMETERS` inside their
physical ranges to all of the family's rows (in-sample), then refits without
each source in turn and predicts it (held out). Prints per-source MAPE both
ways and the fitted values to copy into ``simulators/hardware/<gpu>.yaml``;
writes ``calibration.json`` beside this script.

Run: python experiments/validation/calibrate.py [family ...]   (about 10-20 minutes on 2 cores)
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

from stageopt.errors import StageoptError
from stageopt.validation import load_runs, mape
from stageopt.validation.calibrate import FAMILIES, fit
from stageopt.validation.compare import prepare

HERE = Path(__file__).resolve().parent
PREPARED: list = []
START: tuple = ()


def _held_out(source: str) -> tuple[str, float, int]:
    rest = [p for p in PREPARED if p.run.source != source]
    held = [p for p in PREPARED if p.run.source == source]
    sets = fit(rest, 40, START).hw_set
    from stageopt.validation.compare import predict
    return source, mape([predict(p, sets) for p in held]), len(held)


def calibrate_family(family: str, runs) -> dict:
    global PREPARED, START
    PREPARED = []
    for r in runs:
        if r.expressible and r.hardware in FAMILIES[family]:
            try:
                PREPARED.append(prepare(r))
            except StageoptError:
                pass
    whole = fit(PREPARED)
    START = whole.hw_set
    by_source: dict[str, list] = {}
    for c in whole.comparisons:
        by_source.setdefault(c.run.source, []).append(c)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        held = {s: (m, n) for s, m, n in pool.map(_held_out, sorted(by_source))}
    print(f"\n== {family}: {len(PREPARED)} rows, fitted: {' '.join(whole.hw_set)}")
    print(f"{'source':<40} {'rows':>4} {'in-sample':>10} {'held-out':>9}")
    for source, group in sorted(by_source.items()):
        print(f"{source:<40} {len(group):>4} {mape(group):>9.1f}% {held[source][0]:>8.1f}%")
    print(f"{'all':<40} {len(PREPARED):>4} {mape(whole.comparisons):>9.1f}%")
    return {"hw_set": list(whole.hw_set), "in_sample_mape": mape(whole.comparisons),
            "sources": {s: {"rows": len(g), "in_sample": mape(g), "held_out": held[s][0]}
                        for s, g in by_source.items()}}


def main() -> None:
    runs = load_runs(HERE / "published_runs.csv")
    families = sys.argv[1:] or list(FAMILIES)
    out_path = HERE / "calibration.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    for family in families:
        results[family] = calibrate_family(family, runs)
        out_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
