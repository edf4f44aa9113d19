"""Files of a serving search: every deployment as a CSV row, the answer as JSON, and two plots.

``candidates.csv`` (one row per deployment, with why it is out when it is),
``simulated.csv`` (the deployments the request simulation checked, with their
percentiles), ``best.json`` (the cheapest deployment meeting the SLO, the
Pareto front), ``pareto.png`` (tokens/s per GPU against tokens/s per user at
saturation, colocated and disaggregated apart, the front drawn) and
``cost.png`` (the cheapest admissible cost per GPU type and count). Plots need
matplotlib (the ``plots`` extra); without it they are skipped with a note.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from stageopt.serving.deployment import ServingEstimate
from stageopt.serving.serving_search import Scored, user_rate
from stageopt.serving.serving_space import ServingSpace

PERCENTILES = (50, 90, 99)


def simulated_row(s: Scored, est: ServingEstimate, space: ServingSpace) -> dict:
    q = space.slo.percentile
    row = {"hardware": s.hardware, "plan": s.plan.describe(), "gpus": s.plan.gpus, "usd_per_hour": s.usd_per_hour,
           "meets_slo": est.meets(space.slo), "output_tokens_per_s": est.output_tokens_per_s,
           "usd_per_million_tokens": est.usd_per_million_tokens,
           "ttft_at_slo_percentile_ms": est.latency("ttft", q) * 1e3,
           "tpot_at_slo_percentile_ms": est.latency("tpot", q) * 1e3}
    for metric in ("ttft", "tpot"):
        for q in PERCENTILES:
            row[f"{metric}_p{q}_ms"] = est.sim.percentile(metric, q) * 1e3
    return row


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def write_report(run_dir: Path, space: ServingSpace, scored: list[Scored], simulated: list[dict],
                 best: dict | None, front: list[Scored], plots: bool) -> tuple[list[str], list[str]]:
    """Write the files; returns (paths written, notes)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    written, notes = [], []
    _write_csv(run_dir / "candidates.csv", [s.row() for s in scored])
    _write_csv(run_dir / "simulated.csv", simulated)
    summary = {"space": space.name, "model": space.model_source, "traffic": space.traffic.describe(),
               "slo": {"ttft_ms": space.slo.ttft_ms, "tpot_ms": space.slo.tpot_ms, "percentile": space.slo.percentile},
               "deployments": len(scored), "fit": sum(s.fits for s in scored),
               "admissible": sum(s.fits and not s.reason for s in scored), "best": best,
               "pareto_front": [{**s.row(), "tokens_per_s_per_user": user_rate(s)} for s in front]}
    (run_dir / "best.json").write_text(json.dumps(summary, indent=1))
    written += [str(run_dir / n) for n in ("candidates.csv", "simulated.csv", "best.json")]
    if plots:
        try:
            import matplotlib

            matplotlib.use("Agg")
        except ImportError:
            notes.append("matplotlib is not installed: plots skipped (pip install 'stageopt[plots]')")
            return written, notes
        written.append(str(_pareto_plot(run_dir / "pareto.png", space, scored, front)))
        written.append(str(_cost_plot(run_dir / "cost.png", space, scored)))
    return written, notes


def _pareto_plot(path: Path, space: ServingSpace, scored: list[Scored], front: list[Scored]) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = dict(zip(space.hardware, "osD^v<>"))
    for mode, color in (("colocated", "tab:blue"), ("disaggregated", "tab:orange")):
        for hw in space.hardware:
            pts = [s for s in scored if s.fits and s.hardware == hw and s.plan.disaggregated == (mode != "colocated")]
            if pts:
                ax.scatter([user_rate(s) for s in pts], [s.capacity_per_gpu for s in pts], s=6, alpha=0.35,
                           color=color, marker=markers[hw], label=f"{mode}, {hw}")
    ax.plot([user_rate(s) for s in front], [s.capacity_per_gpu for s in front], "k-", lw=1.5, label="Pareto front")
    ax.set_xlabel("tokens/s per user at saturation (1 / TPOT)")
    ax.set_ylabel("output tokens/s per GPU at saturation")
    ax.set_title(f"{space.name}: throughput against interactivity", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _cost_plot(path: Path, space: ServingSpace, scored: list[Scored]) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for hw in space.hardware:
        for mode, style in (("colocated", "-o"), ("disaggregated", "--s")):
            best: dict[int, float] = {}
            for s in scored:
                if s.hardware == hw and s.fits and not s.reason and s.plan.disaggregated == (mode != "colocated"):
                    best[s.plan.gpus] = min(best.get(s.plan.gpus, float("inf")), s.est.usd_per_million_tokens)
            if best:
                xs = sorted(best)
                ax.plot(xs, [best[x] for x in xs], style, label=f"{hw}, {mode}")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("$ per million output tokens (admissible plans)")
    ax.set_title(f"{space.name}: cheapest plan within the SLO screen", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
