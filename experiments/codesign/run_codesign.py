"""Co-design studies, screened exhaustively with the analytical model (seconds each).

(a) Llama 3 405B on 16,384 GPUs: best plan and time on H100, B200 and GB200-NVL72 (x scale-out
    bandwidth), and the time-vs-cost Pareto front -> codesign_405b.csv, codesign_405b.png.
(b) Sweep scale-out bandwidth (25 -> 200 GB/s per GPU) and NVLink domain size (8, 16, 36, 72) for
    Llama 3 70B and Mixtral 8x22B on 1,024 H100-class GPUs: the best plan at every point and what
    each step buys -> sweep.csv, sweep.png.

Run: python experiments/codesign/run_codesign.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.space import load_space, space_from_dict

HERE = Path(__file__).resolve().parent


def best_by_hardware(census) -> dict[str, dict]:
    best: dict[str, dict] = {}
    for outcome in census.feasible:
        rec = outcome.record
        if rec["hardware"] not in best or rec["iteration_time_s"] < best[rec["hardware"]]["iteration_time_s"]:
            best[rec["hardware"]] = rec
    return best


def pareto(records: list[dict]) -> list[dict]:
    front, cheapest = [], float("inf")
    for rec in sorted(records, key=lambda r: (r["iteration_time_s"], r["usd_per_mtok"])):
        if rec["usd_per_mtok"] < cheapest:
            front.append(rec)
            cheapest = rec["usd_per_mtok"]
    return front


def study_a() -> None:
    space = load_space(str(HERE / "llama3-405b-16k.yaml"))
    census = take_census(space, HardwareCatalog(space))
    records = [o.record for o in census.feasible]
    best = best_by_hardware(census)
    front = pareto(records)
    with open(HERE / "codesign_405b.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["kind", "hardware", "plan", "iteration_time_s", "usd_per_mtok", "mfu", "peak_memory_gib"])
        for hw, rec in sorted(best.items(), key=lambda kv: kv[1]["iteration_time_s"]):
            out.writerow(["best", hw, rec["plan"], round(rec["iteration_time_s"], 3), round(rec["usd_per_mtok"], 4),
                          round(rec["mfu"], 4), round(rec["peak_memory_gib"], 1)])
        for rec in front:
            out.writerow(["pareto", rec["hardware"], rec["plan"], round(rec["iteration_time_s"], 3),
                          round(rec["usd_per_mtok"], 4), round(rec["mfu"], 4), round(rec["peak_memory_gib"], 1)])
    print(f"(a) {len(records):,} feasible plans of {census.combos:,} combinations")
    for hw, rec in sorted(best.items(), key=lambda kv: kv[1]["iteration_time_s"]):
        print(f"    {hw:<42} {rec['iteration_time_s']:7.2f} s  ${rec['usd_per_mtok']:.3f}/Mtok  "
              f"MFU {rec['mfu']:.1%}  {rec['plan']}")
    print(f"    Pareto front: {len(front)} points, from {front[0]['iteration_time_s']:.2f} s "
          f"(${front[0]['usd_per_mtok']:.3f}/Mtok) to {front[-1]['iteration_time_s']:.2f} s "
          f"(${front[-1]['usd_per_mtok']:.3f}/Mtok)")
    _plot_a(records, front)


def _plot_a(records: list[dict], front: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for gpu in dict.fromkeys(r["hardware"].split()[0] for r in records):  # the space's systems, in its order
        pts = [r for r in records if r["hardware"].split()[0] == gpu]
        ax.scatter([r["iteration_time_s"] for r in pts], [r["usd_per_mtok"] for r in pts], s=8, alpha=0.5, label=gpu)
    ax.plot([r["iteration_time_s"] for r in front], [r["usd_per_mtok"] for r in front], "k-o", ms=4, label="Pareto front")
    ax.set_xlabel("iteration time (s), Llama 3 405B, 16,384 GPUs, 16.8M tokens")
    ax.set_ylabel("USD per 1M tokens")
    ax.set_title("Co-design: time vs cost (analytical, every feasible plan)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "codesign_405b.png", dpi=120)


SWEEP_MODELS = {
    "llama3-70b": {"model": "llama3-70b", "training": {"global_batch": 1024, "seq": 8192},
                   "plan": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "cp": [1, 2], "mbs": [1, 2],
                            "zero": [1], "recompute": ["none", "selective", "full"], "sp": "on"}},
    "mixtral-8x22b": {"model": "mixtral-8x22b", "training": {"global_batch": 1024, "seq": 4096},
                      "plan": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "ep": [1, 2, 4, 8], "mbs": [1, 2],
                               "zero": [1], "recompute": ["none", "full"], "sp": "on"}},
}
NODE_GPUS = [8, 16, 36, 72]
SCALEOUT = [25, 50, 100, 200]


def study_b() -> None:
    rows = []
    for name, spec in SWEEP_MODELS.items():
        space = space_from_dict({"name": f"sweep-{name}", "cluster": {"gpus": 1024, "hardware": "h100-sxm"},
                                 "codesign": {"node_gpus": NODE_GPUS, "scaleout_gbps": SCALEOUT},
                                 "objectives": ["time"], **spec})
        census = take_census(space, HardwareCatalog(space))
        best = best_by_hardware(census)
        base = None
        for node in NODE_GPUS:
            for bw in SCALEOUT:
                key = next(k for k in best if f"node.gpus={node} " in k + " " and f"bandwidth_gbps={bw}" in k)
                rec = best[key]
                base = base or rec["iteration_time_s"]
                rows.append([name, node, bw, rec["plan"], rec["iteration_time_s"], base / rec["iteration_time_s"]])
    with open(HERE / "sweep.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["model", "node_gpus", "scaleout_gbps", "best_plan", "iteration_time_s", "speedup_vs_8x25"])
        out.writerows([[r[0], r[1], r[2], r[3], round(r[4], 3), round(r[5], 3)] for r in rows])
    for name in SWEEP_MODELS:
        print(f"(b) {name}: best iteration time (s) by NVLink domain (rows) x scale-out GB/s (columns)")
        print("    " + "".join(f"{bw:>9}" for bw in SCALEOUT))
        for node in NODE_GPUS:
            cells = [r for r in rows if r[0] == name and r[1] == node]
            print(f"    {node:>3} " + "".join(f"{r[4]:9.3f}" for r in cells))
        changes, prev = [], None
        for r in (r for r in rows if r[0] == name):
            short = _short(r[3])
            if short != prev:
                changes.append(f"{r[1]}x{r[2]}: {short}")
                prev = short
        print("    plan changes (domain x GB/s: plan): " + "; ".join(changes))
    _plot_b(rows)


def _short(plan: str) -> str:
    keep = ("tp", "pp", "dp", "cp", "ep", "mbs", "recompute")
    return " ".join(p for p in plan.split() if p.split("=")[0] in keep and not p.endswith("=1") or p.startswith("dp"))


def _plot_b(rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SWEEP_MODELS), figsize=(11, 4))
    for ax, name in zip(axes, SWEEP_MODELS):
        grid = np.array([[r[4] for r in rows if r[0] == name and r[1] == node] for node in NODE_GPUS])
        im = ax.imshow(grid, cmap="viridis_r", aspect="auto")
        ax.set_xticks(range(len(SCALEOUT)), [str(b) for b in SCALEOUT])
        ax.set_yticks(range(len(NODE_GPUS)), [str(n) for n in NODE_GPUS])
        ax.set_xlabel("scale-out GB/s per GPU")
        ax.set_ylabel("NVLink domain (GPUs)")
        ax.set_title(f"{name}: best iteration time (s)")
        for i in range(len(NODE_GPUS)):
            for j in range(len(SCALEOUT)):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(HERE / "sweep.png", dpi=120)


if __name__ == "__main__":
    study_a()
    study_b()
