"""Study plots: optimization history, Pareto front, parameter importance, breakdown of the best plan.

PNG with matplotlib (a core dependency). HTML with optuna.visualization when plotly
is installed (the ``plots`` extra), with plotly.js written once beside the pages so
they open offline. Only feasible
trials (valid, fitting memory, simulated by the study's backend or the screen)
are plotted: penalties told for invalid plans would flatten every axis.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from stageopt.search.cache import trial_outcome
from stageopt.search.objective import OK, Objective, Outcome


@dataclass
class ReportFiles:
    """Paths written and notes (skipped plots) of one report, for the files: line."""

    written: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)



def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials holding a feasible result, one per plan (a 0.2 study may repeat plans)."""
    seen: dict[str, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        outcome = trial_outcome(t)
        if outcome is not None and outcome.status == OK:
            seen.setdefault(outcome.key, t)
    return list(seen.values())


def write_plots(study: optuna.Study, run_dir: Path, objectives: tuple[Objective, ...], backend: str,
                best: Sequence[Outcome], files: ReportFiles) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        files.notes.append("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return
    trials = feasible_trials(study)
    if not trials:
        files.notes.append("plots skipped: no feasible trial")
        return
    figures = {"history": _history(plt, trials, objectives), "pareto": _pareto(plt, trials, objectives),
               "importance": _importance(plt, study.study_name, trials, objectives, files),
               "breakdown": _breakdown(plt, best[0]) if best else None}
    for name, fig in figures.items():
        if fig is None:
            continue
        path = run_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.written.append(str(path))
    _html(study, run_dir, trials, objectives, files)


def _history(plt, trials: list[optuna.trial.FrozenTrial], objectives: tuple[Objective, ...]):
    obj = objectives[0]
    numbers = np.array([t.number for t in trials])
    values = np.array([t.values[0] for t in trials])
    best = np.minimum.accumulate(values) if obj.direction == "minimize" else np.maximum.accumulate(values)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter(numbers, values, s=8, alpha=0.4, label="feasible trial")
    ax.step(numbers, best, where="post", color="C3", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(obj.label)
    ax.set_title("optimization history")
    ax.legend()
    return fig


def _pareto(plt, trials: list[optuna.trial.FrozenTrial], objectives: tuple[Objective, ...]):
    """Objective 1 vs 2 (or time vs peak memory for one objective), the non-dominated points highlighted."""
    from stageopt.search.ranking import pareto_ranks

    recs = [trial_outcome(t).record for t in trials]  # type: ignore[union-attr]
    if len(objectives) >= 2:
        x = np.array([t.values[0] for t in trials])
        y = np.array([t.values[1] for t in trials])
        labels = (objectives[0].label, objectives[1].label)
        signs = [1.0 if o.direction == "minimize" else -1.0 for o in objectives[:2]]
    else:
        x = np.array([r["peak_memory_gib"] for r in recs])
        y = np.array([t.values[0] for t in trials])
        labels = ("peak memory (GiB)", objectives[0].label)
        signs = [1.0, 1.0 if objectives[0].direction == "minimize" else -1.0]
    front = pareto_ranks(np.column_stack([x * signs[0], y * signs[1]])) == 0
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter(x[~front], y[~front], s=8, alpha=0.35, label="feasible trial")
    order = np.argsort(x[front])
    ax.plot(x[front][order], y[front][order], "o-", color="C3", ms=4, label="Pareto front")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title("Pareto front")
    ax.legend()
    return fig


def _feasible_study(name: str, trials: list[optuna.trial.FrozenTrial], objectives: tuple[Objective, ...]) -> optuna.Study:
    study = optuna.create_study(study_name=f"{name}-feasible", directions=[o.direction for o in objectives])
    study.add_trials(trials)
    return study


def _importance(plt, name: str, trials: list[optuna.trial.FrozenTrial], objectives: tuple[Objective, ...],
                files: ReportFiles):
    if len(trials) < 4 or not any(len(t.params) for t in trials):
        files.notes.append("importance plot skipped: fewer than 4 feasible trials or no searched parameter")
        return None
    study = _feasible_study(name, trials, objectives)
    sign = 1.0 if objectives[0].direction == "minimize" else -1.0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PED-ANOVA's note that it ranks for low values: we pass sign
            imp = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                target=lambda t: sign * t.values[0])
    except (RuntimeError, ValueError) as err:
        files.notes.append(f"importance plot skipped: {err}")
        return None
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(imp) + 1.2))
    names = list(imp)[::-1]
    ax.barh(names, [imp[n] for n in names])
    ax.set_xlabel(f"importance for {objectives[0].label} (PED-ANOVA)")
    ax.set_title("parameter importance")
    return fig


def _breakdown(plt, best: Outcome):
    rec = best.record
    times = {k: v for k, v in rec["time_breakdown_s"].items() if k != "exposed_comm" and v > 0}
    if not times:
        times = dict(rec["time_breakdown_s"])
    mem = rec["memory_breakdown_gib"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    a1.barh(list(times)[::-1], list(times.values())[::-1], color="C0")
    a1.set_xlabel("seconds per iteration")
    a1.set_title(f"time: {rec['iteration_time_s']:.3f} s")
    a2.barh(list(mem)[::-1], list(mem.values())[::-1], color="C2")
    a2.axvline(rec["hbm_gib"], color="C3", ls="--", label=f"HBM {rec['hbm_gib']:g} GiB")
    a2.set_xlabel("GiB per GPU (peak rank)")
    a2.set_title(f"memory: {rec['peak_memory_gib']:.1f} GiB")
    a2.legend()
    fig.suptitle(rec["plan"], fontsize=8)
    fig.tight_layout()
    return fig


def _html(study: optuna.Study, run_dir: Path, trials: list[optuna.trial.FrozenTrial],
          objectives: tuple[Objective, ...], files: ReportFiles) -> None:
    try:
        import plotly  # noqa: F401
    except ImportError:
        files.notes.append("HTML plots skipped: plotly is not installed (pip install 'stageopt[plots]')")
        return
    import optuna.visualization as vis

    feas = _feasible_study(study.study_name, trials, objectives)
    names = [o.label for o in objectives]
    target = (lambda t: t.values[0]) if len(objectives) > 1 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the importance evaluator's note that it ranks for low values
        figs = {"history": vis.plot_optimization_history(feas, target=target, target_name=names[0]),
                "importance": vis.plot_param_importances(feas, target=lambda t: t.values[0], target_name=names[0])}
    if len(objectives) > 1:
        figs["pareto"] = vis.plot_pareto_front(feas, target_names=names)
    for name, fig in figs.items():
        path = run_dir / f"{name}.html"
        fig.write_html(str(path), include_plotlyjs="directory")  # plotly.min.js beside it: works offline
        files.written.append(str(path))
    files.written.append(str(run_dir / "plotly.min.js"))
