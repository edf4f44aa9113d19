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
from stageopt.errors import StageoptError
from stageopt.search.cache import KEY_ATTR, simulated_key, trial_outcome
from stageopt.search.driver import best_outcomes
from stageopt.search.journal import os_error_line
from stageopt.search.objective import FAILED, Objective, Outcome
from stageopt.search.plots import ReportFiles, write_plots

PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs", "zero", "recompute", "sp", "schedule")
METRIC_COLUMNS = ("iteration_time_s", "tokens_per_s", "mfu", "model_tflops_per_gpu", "peak_memory_gib", "hbm_gib",
                  "reserve_gib", "free_gib", "usd_per_gpu_hour", "usd_per_mtok")
SUMMARY_ATTR = "stageopt_last_search"  # the last search's summary (best.json's head), kept in the study
STALE_REASON = "its worker stopped (failed by the stale-trial check; the plan is retried)"


def stored_outcomes(study: optuna.Study) -> list[Outcome]:
    """Every result the study holds, one per trial that holds one (repeats and failures hold none)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        outcome = trial_outcome(t)
        if outcome is not None and outcome.status != FAILED:
            out.append(outcome)
    return out


def study_best(study: optuna.Study, objectives: tuple[Objective, ...], backend: str) -> list[Outcome]:
    return best_outcomes(stored_outcomes(study), objectives, backend)


def _row(t: optuna.trial.FrozenTrial, n_objectives: int) -> list[Any]:
    attrs = t.user_attrs
    outcome = trial_outcome(t)
    rec = outcome.record if outcome is not None else {}
    key = str(attrs.get(KEY_ATTR, rec.get("key", "")))
    plan_text = str(rec.get("plan") or (key.rsplit(" | ", 1)[-1] if " | " in key else ""))
    plan = dict(item.split("=", 1) for item in plan_text.split() if "=" in item)
    values = list(t.values) if t.values is not None else [""] * n_objectives
    status = outcome.status if outcome is not None else attrs.get("status", "")
    reason = rec.get("reason", attrs.get("reason", ""))
    if t.state == TrialState.FAIL and not status and not reason:
        reason = STALE_REASON
    simulated = attrs.get("simulated", (attrs.get("result") or {}).get("simulated", ""))
    cons = t.constraints
    return [t.number, t.state.name, status, simulated, attrs.get("repeat_of", ""), *values, plan_text,
            rec.get("gpus", ""), rec.get("hardware", ""), *[plan.get(c, "") for c in PLAN_COLUMNS],
            *[rec.get(c, "") for c in METRIC_COLUMNS], cons.get("valid", ""), cons.get("memory_gib", ""), reason]


def write_trials_csv(study: optuna.Study, objectives: tuple[Objective, ...], path: Path) -> None:
    head = ["number", "state", "status", "simulated", "repeat_of", *[o.name for o in objectives], "plan", "gpus",
            "hardware", *PLAN_COLUMNS, *METRIC_COLUMNS, "constraint_valid", "constraint_memory_gib", "reason"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        for t in study.get_trials(deepcopy=False):
            writer.writerow(_row(t, len(objectives)))


def best_json(best: Sequence[Outcome], objectives: tuple[Objective, ...], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "objectives": [{"name": o.name, "direction": o.direction, "field": o.field} for o in objectives],
            "best": [o.record for o in best]}


def render_table(best: Sequence[Outcome], objectives: tuple[Objective, ...]) -> str:
    """The best plan(s): time, memory, MFU, cost and the time breakdown, as a tabulate table."""
    if not best:
        return "no feasible plan was simulated"
    rows = [[i, f"{r['iteration_time_s']:.3f}", f"{r['peak_memory_gib']:.1f}",
             f"{r.get('free_gib', r['hbm_gib'] - r['peak_memory_gib']):.1f}", f"{r['mfu']:.1%}",
             f"{r['tokens_per_s']:,.0f}", f"{r['usd_per_mtok']:.3f}", f"{r['plan']}  [{r['hardware']}, {r['gpus']} GPUs]"]
            for i, r in enumerate((o.record for o in best), 1)]
    lines = render_rows(["#", "time s", "mem GiB", "free GiB", "MFU", "tok/s", "$/Mtok", "plan / hardware"], rows,
                        align=["right"] * 7 + ["left"], rule=False).splitlines()  # header, then one line per plan
    top = best[0].record
    parts = "  ".join(f"{k} {v:.3f}" for k, v in top["time_breakdown_s"].items() if v)
    mem = "  ".join(f"{k} {v:.1f}" for k, v in top["memory_breakdown_gib"].items())
    lines.append(f"    time breakdown (s): {parts}")
    reserve = top.get("reserve_gib", 0.0)
    lines.append(f"    memory (GiB): {mem}  of {top['hbm_gib']:g} (reserve {reserve:.1f}, free "
                 f"{top.get('free_gib', top['hbm_gib'] - top['peak_memory_gib']):.1f})")
    return "\n".join(lines)


def write_report(study: optuna.Study, run_dir: Path, objectives: tuple[Objective, ...], backend: str,
                 meta: dict[str, Any], plots: bool = True) -> ReportFiles:
    """Write trials.csv, best.json and (optionally) the plots into ``run_dir``; a write error is one line."""
    files = ReportFiles()
    target = run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        target = run_dir / "trials.csv"
        write_trials_csv(study, objectives, target)
        files.written.append(str(target))
        best = study_best(study, objectives, backend)
        target = run_dir / "best.json"
        target.write_text(json.dumps(best_json(best, objectives, meta), indent=1) + "\n")
        files.written.append(str(target))
        if plots:
            target = run_dir
            write_plots(study, run_dir, objectives, backend, best, files)
    except OSError as err:
        raise StageoptError(os_error_line(target, err, "write the study's files")) from None
    return files


def stored_summary(study: optuna.Study, last: Any, run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """best.json's head for ``report``: the last search's summary, with the counts the study holds now."""
    head = dict(last) if isinstance(last, dict) else {"study": study.study_name, "backend": meta["backend"],
                                                      "objectives": list(meta["objectives"])}
    trials = study.get_trials(deepcopy=False)
    simulated = {k for t in trials if t.state.is_finished() and (k := simulated_key(t)) is not None}
    head.update(run_dir=str(run_dir), trials=len(trials), simulations=len(simulated),
                space=head.get("space") or meta.get("space", {}).get("name", ""))
    return head
