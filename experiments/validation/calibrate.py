"""Fit each GPU family's kernel-model parameters to the published runs, with leave-one-source-out checks.

For every family (A100, Hopper = H100/H200, Blackwell = B200/GB200) this fits
the parameters of :data:`stageopt.validation.calibrate.PARAMETERS` inside their
physical ranges to all of the family's rows (in-sample, every source weighted
equally), then estimates each source's error under a refit without it (held
out; a bounded Gauss-Newton step from the fit, or full refits with --exact).
Prints per-source MAPE both ways, Spearman's rho and top-1 regret within
families of plans, and the fitted values for ``simulators/hardware/<gpu>.yaml``;
writes ``calibration.json`` beside this script.

Run: python experiments/validation/calibrate.py [--exact] [family ...]
     (about 5 minutes per family on an idle 2-core machine; --exact is ~10x longer)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from stageopt.errors import StageoptError
from stageopt.validation import family_ranking, load_runs, mape
from stageopt.validation.calibrate import FAMILIES, fit, held_out_errors, information_shares, leave_one_source_out
from stageopt.validation.compare import by_key, prepare

HERE = Path(__file__).resolve().parent


def _prepared(family: str, runs) -> list:
    out = []
    for r in runs:
        if r.expressible and r.hardware in FAMILIES[family]:
            try:
                out.append(prepare(r))
            except StageoptError:
                pass
    return out


def calibrate_family(family: str, runs, exact: bool) -> dict:
    prepared = _prepared(family, runs)
    whole = fit(prepared)
    if exact:
        held = {s: np.array([c.error for c in g]) for s, g in leave_one_source_out(prepared, start=whole.hw_set).items()}
    else:
        held = held_out_errors(whole, prepared)
    by_source = by_key(whole.comparisons, lambda c: c.run.source)
    print(f"\n== {family}: {len(prepared)} rows; fitted: {' '.join(whole.hw_set)}")
    print(f"{'source':<40} {'rows':>4} {'in-sample':>10} {'held-out':>9}")
    sources = {}
    for source, group in sorted(by_source.items()):
        out_mape = float(100 * np.mean(np.abs(held[source]))) if source in held else float("nan")
        sources[source] = {"rows": len(group), "in_sample": mape(group), "held_out": out_mape}
        print(f"{source:<40} {len(group):>4} {mape(group):>9.1f}% {out_mape:>8.1f}%")
    all_held = np.concatenate([held[s] for s in held]) if held else np.array([])
    print(f"{'all':<40} {len(prepared):>4} {mape(whole.comparisons):>9.1f}% {100 * np.mean(np.abs(all_held)):>8.1f}%")
    families = family_ranking(whole.comparisons)
    for name, (n, rho, regret) in sorted(families.items()):
        print(f"  family {name:<30} runs {n:>3}  rho {rho:5.2f}  top-1 regret {100 * regret:5.1f}%")
    information = _leading_sources(information_shares(whole, prepared))
    for key, leading in information.items():
        shares = ", ".join(f"{source} {100 * share:.0f}%" for source, share in leading.items())
        print(f"  what the rows say about {key.removeprefix('gpu.efficiency.')}: {shares}")
    return {"hw_set": list(whole.hw_set), "rows": len(prepared), "in_sample_mape": mape(whole.comparisons),
            "held_out_mape": float(100 * np.mean(np.abs(all_held))), "held_out": "exact" if exact else "linearized",
            "sources": sources, "families": {k: {"runs": n, "rho": r, "top1_regret": g}
                                             for k, (n, r, g) in families.items()},
            "information": information}


def _leading_sources(shares: dict[str, dict[str, float]], count: int = 3) -> dict[str, dict[str, float]]:
    """Per parameter, the ``count`` sources carrying the most of what the rows say about it, and their shares."""
    return {key: dict(sorted(by_source.items(), key=lambda item: -item[1])[:count])
            for key, by_source in shares.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="Fit each GPU family's physical parameters to the published runs.")
    parser.add_argument("families", nargs="*", metavar="FAMILY",
                        help=f"GPU families to fit (default: all of {', '.join(sorted(FAMILIES))})")
    parser.add_argument("--exact", action="store_true", help="refit for every held-out source (slow)")
    args = parser.parse_args()
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown GPU family {', '.join(unknown)}; choose from {', '.join(sorted(FAMILIES))}")
    exact, families = args.exact, args.families or list(FAMILIES)
    runs = load_runs(HERE / "published_runs.csv")
    out_path = HERE / "calibration.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    for family in families:
        results[family] = calibrate_family(family, runs, exact)
        out_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
