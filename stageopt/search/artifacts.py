"""Files a study leaves in ``runs/<study>/``: trials.csv, best.json and plots, all rebuilt from storage.

Why from storage only: ``stageopt report runs/<study>`` must give the same files
after a crash, a resume or on another machine that shares the database, so
nothing here reads the search process's memory. Plots are matplotlib PNGs (the
optional ``plots`` extra); interactive HTML uses optuna.visualization when plotly
is installed and is skipped with a note otherwise.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from stageopt.console import render_rows
from stageopt.search.cache import RESULT_ATTR, STORED_ONLY
from stageopt.search.driver import best_outcomes
from stageopt.search.objective import Objective, Outcome
from stageopt.search.plots import ReportFiles, write_plots

PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs", "zero", "recompute", "sp", "schedule")
METRIC_COLUMNS = ("iteration_time_s", "tokens_per_s", "mfu", "model_tflops_per_gpu", "peak_memory_gib", "hbm_gib",
                  "usd_per_gpu_hour", "usd_per_mtok")


def stored_outcomes(study: optuna.Study) -> list[Outcome]:
    """Every finished, non-failed result in the study (one per trial; repeats share a key)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        stored = t.user_attrs.get(RESULT_ATTR)
        if isinstance(stored, dict) and "status" in stored:
            out.append(Outcome(stored["status"], {k: v for k, v in stored.items() if k not in STORED_ONLY}))
    return out


def study_best(study: optuna.Study, objectives: tuple[Objective, ...], backend: str) -> list[Outcome]:
    return best_outcomes(stored_outcomes(study), objectives, backend)


def write_trials_csv(study: optuna.Study, objectives: tuple[Objective, ...], path: Path) -> None:
    head = ["number", "state", "status", "cached", "simulated", *[o.name for o in objectives], "plan", "gpus", "hardware",
            *PLAN_COLUMNS, *METRIC_COLUMNS, "constraint_valid", "constraint_memory_gib", "reason"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        for t in study.get_trials(deepcopy=False):
            rec = t.user_attrs.get(RESULT_ATTR) or {}
            plan = dict(item.split("=", 1) for item in str(rec.get("plan", "")).split() if "=" in item)
            values = list(t.values) if t.values is not None else [""] * len(objectives)
            cons = t.constraints
            writer.writerow([t.number, t.state.name, rec.get("status", ""), rec.get("cached", ""),
                             rec.get("simulated", ""), *values, rec.get("plan", ""), rec.get("gpus", ""), rec.get("hardware", ""),
                             *[plan.get(c, "") for c in PLAN_COLUMNS], *[rec.get(c, "") for c in METRIC_COLUMNS],
                             cons.get("valid", ""), cons.get("memory_gib", ""),
                             rec.get("reason", t.user_attrs.get("reason", ""))])


def best_json(best: Sequence[Outcome], objectives: tuple[Objective, ...], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "objectives": [{"name": o.name, "direction": o.direction, "field": o.field} for o in objectives],
            "best": [o.record for o in best]}


def render_table(best: Sequence[Outcome], objectives: tuple[Objective, ...]) -> str:
    """The best plan(s): time, memory, MFU, cost and the time breakdown, as a tabulate table."""
    if not best:
        return "no feasible plan was simulated"
    rows = [[i, f"{r['iteration_time_s']:.3f}", f"{r['peak_memory_gib']:.1f}", f"{r['mfu']:.1%}",
             f"{r['tokens_per_s']:,.0f}", f"{r['usd_per_mtok']:.3f}", f"{r['plan']}  [{r['hardware']}, {r['gpus']} GPUs]"]
            for i, r in enumerate((o.record for o in best), 1)]
    lines = render_rows(["#", "time s", "mem GiB", "MFU", "tok/s", "$/Mtok", "plan / hardware"], rows,
                        align=["right"] * 6 + ["left"], rule=False).splitlines()  # header, then one line per plan
    top = best[0].record
    parts = "  ".join(f"{k} {v:.3f}" for k, v in top["time_breakdown_s"].items() if v)
    mem = "  ".join(f"{k} {v:.1f}" for k, v in top["memory_breakdown_gib"].items())
    lines.append(f"    time breakdown (s): {parts}")
    lines.append(f"    memory (GiB): {mem}  of {top['hbm_gib']:g}")
    return "\n".join(lines)


def write_report(study: optuna.Study, run_dir: Path, objectives: tuple[Objective, ...], backend: str,
                 meta: dict[str, Any], plots: bool = True) -> ReportFiles:
    """Write trials.csv, best.json and (optionally) the plots into ``run_dir``."""
    files = ReportFiles()
    run_dir.mkdir(parents=True, exist_ok=True)
    write_trials_csv(study, objectives, run_dir / "trials.csv")
    files.written.append(str(run_dir / "trials.csv"))
    best = study_best(study, objectives, backend)
    (run_dir / "best.json").write_text(json.dumps(best_json(best, objectives, meta), indent=1) + "\n")
    files.written.append(str(run_dir / "best.json"))
    if plots:

        write_plots(study, run_dir, objectives, backend, best, files)
    return files
