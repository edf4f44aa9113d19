"""``stageopt calibrate``: fit a hardware file's kernel shares to steps measured on your own cluster.

The published runs differ from one another by software release and cluster as
much as by anything the model itemizes; a user's own few measured steps pin
their stack down. The fit moves only the physical parameters calibration fits
for the shipped presets, inside the same ranges, and reports the error on each
group of runs held out of the fit, so the figure to expect on plans not
measured is printed beside the in-sample one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from stageopt.errors import ConfigError, StageoptError
from stageopt.inputs.measured_columns import OPTIONAL, REQUIRED

if TYPE_CHECKING:  # the fit imports scipy and the simulators: only when the command runs, not at CLI start
    from stageopt.validation.compare import PreparedRun

FIT_NAMES = {
    "gemm": "gpu.efficiency.matmul.peak_fraction",
    "fp8-gemm": "gpu.efficiency.matmul.fp8_peak_fraction",
    "attention": "gpu.efficiency.attention_forward.peak_fraction",
    "launch": "gpu.efficiency.launch_us",
    "host": "gpu.efficiency.host_us",
}
DEFAULT_FIT = ("gemm", "fp8-gemm", "attention")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="fit a hardware file to steps measured on your cluster",
                       description=__doc__.splitlines()[0].split(": ", 1)[1],
                       epilog=f"MEASURED.csv needs the columns {', '.join(REQUIRED)} (metric: iteration_time_s, "
                              f"tokens_per_s_per_gpu, tflops_per_gpu or mfu); optional: {', '.join(OPTIONAL)}. "
                              "See stageopt/validation/measured.py or the README.")
    p.add_argument("measured", metavar="MEASURED.csv", help="one row per measured run")
    p.add_argument("--hardware", default="h100-sxm", help="hardware preset or YAML file to start from")
    p.add_argument("--hw-set", dest="hw_set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware field for every run before fitting, e.g. scaleout.bandwidth_gbps=25 "
                        "(kept in the written file)")
    p.add_argument("--framework", metavar="NAME|FILE",
                   help="software stack of rows without a framework column (default megatron-core)")
    p.add_argument("--fit", default=",".join(DEFAULT_FIT), metavar="NAMES",
                   help=f"comma-separated parameters to fit, of {', '.join(FIT_NAMES)} (default "
                        f"{','.join(DEFAULT_FIT)}: gemm where some runs are BF16, fp8-gemm where some are FP8)")
    p.add_argument("--out", type=Path, metavar="FILE.yaml",
                   help="calibrated hardware file to write (default <hardware>-calibrated.yaml here)")
    p.add_argument("--exact", action="store_true", help="refit for every held-out group (slower)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def fit_keys(text: str, runs: list[PreparedRun]) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FIT_NAMES]
    if unknown or not names:
        raise ConfigError(f"--fit {text!r}: unknown parameter {unknown[0] if unknown else '(none)'!r}; "
                          f"choose from {', '.join(FIT_NAMES)}")
    from stageopt.frameworks.profile import LOW_PRECISION_RECIPES

    low = any(p.work.plan.dtype in LOW_PRECISION_RECIPES for p in runs)  # NVFP4 GEMMs take the FP8 share
    high = any(p.work.plan.dtype not in LOW_PRECISION_RECIPES for p in runs)
    defaulted = names == list(DEFAULT_FIT)  # by default each GEMM share only where runs use that precision
    keys = [FIT_NAMES[n] for n in names if (low or n != "fp8-gemm") and (high or n != "gemm" or not defaulted)]
    if len(runs) < len(keys) + 1:
        raise ConfigError(f"{len(runs)} runs cannot fit {len(keys)} parameters and still test the fit; measure "
                          f"more plans or fit fewer (e.g. --fit gemm)")
    return keys


def prepared_runs(args: argparse.Namespace) -> list[PreparedRun]:
    from stageopt.validation.compare import prepare
    from stageopt.validation.measured import load_measured

    runs = load_measured(args.measured, args.hardware, args.framework, tuple(args.hw_set))
    out = []
    for run in runs:
        try:
            out.append(prepare(run))
        except StageoptError as err:
            raise ConfigError(f"{run.id}: {err}") from None
    return out


def run(args: argparse.Namespace) -> int:
    report, runs, keys, loose = calibrate(args)
    print(json.dumps(report, indent=1) if args.json else render(report, runs[0], keys, loose))
    return 0


def calibrate(args: argparse.Namespace) -> tuple[dict, list[PreparedRun], list[str], tuple[str, ...]]:
    """Fit, hold each group out, write the file; the report (as ``--json`` prints it) and what it rests on."""
    import numpy as np

    from stageopt.sim.run import hardware_for
    from stageopt.validation.calibrate import (fit_identified, held_out_errors, information_shares,
                                               leave_one_source_out)
    from stageopt.validation.calibrated_file import write_calibrated_hardware
    from stageopt.validation.compare import family_ranking, mape, predict

    hardware_for(args.hardware, args.hw_set)  # a bad preset or override is named before any row is read
    out = args.out or Path(f"{Path(args.hardware).stem}-calibrated.yaml")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: folder {str(out.parent)!r} does not exist; create it or write elsewhere")
    runs = prepared_runs(args)
    keys = fit_keys(args.fit, runs)
    before = [predict(p) for p in runs]
    whole, loose = fit_identified(runs, keys, robust=True)
    if args.exact:
        held = {s: np.array([c.error for c in g])
                for s, g in leave_one_source_out(runs, start=whole.hw_set, keys=whole.keys, robust=True).items()}
    else:
        held = held_out_errors(whole, runs)
    held_by_row = _held_by_row(runs, held)
    base = args.hardware
    fitted = dict(item.split("=", 1) for item in whole.hw_set)
    header = [f"Calibrated by 'stageopt calibrate {args.measured} --hardware {base}' to {len(runs)} measured runs.",
              f"Fitted: {' '.join(whole.hw_set)}.",
              f"Throughput MAPE on those runs: {mape(before):.1f}% with {base}, {mape(whole.comparisons):.1f}% "
              f"calibrated, {_percent(_mape(held_by_row))} on each group held out of the fit."]
    try:
        write_calibrated_hardware(base, list(args.hw_set) + list(whole.hw_set), out, header,
                                  _accuracy(args.measured, len(runs), mape(whole.comparisons), _mape(held_by_row),
                                            family_ranking(whole.comparisons)))
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot write it ({err.strerror}); choose a writable path") from None
    shares = information_shares(whole, runs)  # each group's share of what the runs say about each parameter
    report = {"hardware": base, "written": str(out), "fitted": fitted, "not_pinned_down": list(loose),
              "runs": [{"id": b.run.id, "measured": b.measured, "preset": b.predicted, "calibrated": a.predicted,
                        "preset_error": b.error, "calibrated_error": a.error, "held_out_error": h}
                       for b, a, h in zip(before, whole.comparisons, held_by_row)],
              "mape_preset": mape(before), "mape_calibrated": mape(whole.comparisons),
              "mape_held_out": _mape(held_by_row), "at_bound": _at_bound(whole),
              "information": shares,
              "rests_on_one_group": _rests_on_one_group(shares),
              "ranking": {k: {"runs": n, "rho": r, "top1_regret": g}
                          for k, (n, r, g) in family_ranking(whole.comparisons).items()}}
    return report, runs, keys, loose


def _accuracy(measured, runs: int, in_sample: float, held_out: float | None, ranking: dict) -> dict | None:
    """The calibrated file's accuracy record (None where no group could be held out of the fit); ``ranking``:
    :func:`stageopt.validation.compare.family_ranking` of the calibrated runs."""
    if held_out is None:
        return None
    regret = max((100 * g for _, _, g in ranking.values()), default=0.0)
    return {"family": Path(measured).stem, "runs": runs, "in_sample_mape": round(in_sample, 1),
            "held_out_mape": round(held_out, 1), "ranked_sweeps": len(ranking), "top1_regret": round(regret, 1)}


ONE_GROUP = 0.8  # a group carrying four fifths of what the runs say about a parameter sets it alone


def _rests_on_one_group(shares: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Fitted parameters that one group of runs sets (:data:`ONE_GROUP` or more of their information,
    :func:`stageopt.validation.calibrate.information_shares`), with that group and its share; with one
    group there is nothing to compare."""
    out = {}
    for key, by_group in shares.items():
        group, share = max(by_group.items(), key=lambda item: item[1])
        if len(by_group) > 1 and share >= ONE_GROUP:
            out[key] = {"group": group, "share": share}
    return out


def _at_bound(whole) -> dict[str, str]:
    """Fitted parameters pressed against an end of their physical range: the runs want them past it, which
    is a term the model lacks, not a value to trust."""
    lo, hi = whole.bounds
    out = {}
    for key, x, low, high in zip(whole.keys, whole.x, lo, hi):
        margin = 1e-3 * (high - low)
        if x - low < margin or high - x < margin:
            out[key] = "lower" if x - low < margin else "upper"
    return out


def _held_by_row(runs: list[PreparedRun], held: dict) -> list[float | None]:
    """Each row's error under the fit that left its group out (None where no other group exists)."""
    seen: dict[str, int] = {}
    out = []
    for p in runs:
        source = p.run.source
        i = seen.get(source, 0)
        seen[source] = i + 1
        out.append(float(held[source][i]) if source in held else None)
    return out


def _mape(errors: list[float | None]) -> float | None:
    """MAPE in percent of the known errors; None where no run could be held out (one group)."""
    known = [abs(e) for e in errors if e is not None]
    return 100 * sum(known) / len(known) if known else None


def render(report: dict, first: PreparedRun, keys: list[str], loose: tuple[str, ...]) -> str:
    lines = [f"calibrating {report['hardware']} to {len(report['runs'])} measured runs "
             f"(each group held out of the fit in turn)",
             f"  {'parameter':<48} {'file':>8} {'fitted':>8}"]
    for key in keys:
        was = _value(first, key)
        now = report["fitted"].get(key)
        shown = f"{float(now):>8.4g}" if now is not None else "    kept (no run is sensitive to it)"
        lines.append(f"  {key.removeprefix('gpu.efficiency.'):<48} {was:>8.4g} {shown}")
    width = max(len("throughput MAPE"), *(len(row["id"]) for row in report["runs"]))
    lines.append(f"  {'run (throughput error)':<{width}} {'measured':>10} {'preset':>9} {'calibrated':>11} "
                 f"{'held out':>9}")
    for row in report["runs"]:
        held = f"{100 * row['held_out_error']:+8.1f}%" if row["held_out_error"] is not None else "        -"
        lines.append(f"  {row['id']:<{width}} {row['measured']:>10.5g} {100 * row['preset_error']:+8.1f}% "
                     f"{100 * row['calibrated_error']:+10.1f}% {held}")
    lines.append(f"  {'throughput MAPE':<{width}} {'':>10} {report['mape_preset']:>8.1f}% "
                 f"{report['mape_calibrated']:>10.1f}% {_percent(report['mape_held_out']):>9}")
    ranking = report["ranking"].values()
    if ranking:
        lines.append(f"  plans of one model ({len(ranking)} models with 3+ runs): Spearman rho from "
                     f"{min(r['rho'] for r in ranking):.2f}, top-1 regret up to "
                     f"{100 * max(r['top1_regret'] for r in ranking):.1f}%")
    if loose:
        lines.append(f"  not fitted (no run moves 1% across its range): {', '.join(loose)}")
    if report["at_bound"]:
        ends = ", ".join(f"{k.removeprefix('gpu.efficiency.')} ({side})" for k, side in report["at_bound"].items())
        lines.append(f"  at an end of its physical range (the runs want it past: a term the model lacks): {ends}")
    if report["rests_on_one_group"]:
        alone = ", ".join(f"{k.removeprefix('gpu.efficiency.')} ({v['group']}, {100 * v['share']:.0f}%)"
                          for k, v in report["rests_on_one_group"].items())
        lines.append(f"  set by one group (its share of what the runs say; held out, the others barely "
                     f"constrain it): {alone}")
    lines.append(f"wrote {report['written']}: use it with --hardware {report['written']}")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return f"{value:.1f}%" if value is not None else "- (one group: nothing to hold out)"


def _value(run: PreparedRun, key: str) -> float:
    from stageopt.validation.calibrate import hardware_value

    value = hardware_value(run, key)
    return value if value is not None else float("nan")
