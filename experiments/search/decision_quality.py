"""Decision quality of `stageopt search`: the gap to the exact optimum, wall time and simulations, per sampler
and budget over seeds, on spaces of different shapes (experiments/search/spaces/).

Analytical backend: the exact optimum is the census's (every valid plan scored); ``auto`` returns it, the
Optuna samplers (tpe, random) sample the space with a budget. Besides the spaces of experiments/search/spaces/,
two shipped spaces (``search_spaces/NAME``) search the modern plan fields: pipeline schedules (ZB-H1,
DualPipe), uneven stages (first/last-stage layers, embedding and loss counted as layers). Replay backend (spaces small enough to
replay every feasible plan, ``replay_table.py``): the exact optimum is replay's own; ``auto`` confirms
the census's best plans guided by the residual model, ``brute`` replays in plain analytical order, ``tpe``
samples. Every run goes through ``run_search`` (what ``stageopt search`` runs) with its own journal.
Run: python experiments/search/decision_quality.py [--seeds 10] [--only SPACE] [--part analytical|replay|all]
Writes experiments/search/results/decision_quality[_PART][_SPACE].{json,csv} and prints the summary table.
The numbers move when the cost model changes; re-run this script (analytical part: about 10 min on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.objective import objectives_for
from stageopt.search.session import SearchOptions, run_search
from stageopt.search.space import load_space

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPACES = HERE / "spaces"
RESULTS = HERE / "results"
ANALYTICAL = ["llama2-7b-64", "gpt3-175b-1024", "mixtral-8x22b-512", "deepseek-v3-2048", "llama3-405b-16k",
              "codesign-70b", "search_spaces/deepseek-v3-2k", "search_spaces/llama3-405b-16k"]
ANALYTICAL_RUNS = [("auto", 0), ("tpe", 100), ("random", 100)]
TPE_500 = ["llama2-7b-64", "mixtral-8x22b-512"]  # budget 500 costs 10-50 s a seed on 2 busy cores: two spaces
REPLAY = ["llama2-7b-64"]
REPLAY_RUNS = [("auto", 100), ("brute", 100), ("tpe", 100)]
DETERMINISTIC = ("brute",)  # plain analytical order: every seed runs the same plans, so one seed is run


def gap(value: float, optimum: float, direction: str) -> float:
    """Relative shortfall of ``value`` against the optimum (0 = optimal)."""
    return value / optimum - 1 if direction == "minimize" else optimum / value - 1


def one_run(space: str, backend: str, sampler: str, budget: int, seed: int, optimum: float, runs: str) -> dict:
    start = time.perf_counter()
    study = f"{space.replace('/', '-')}-{backend}-{sampler}-{budget}-{seed}"
    res = run_search(SearchOptions(space=space_path(space), sampler=sampler, budget=max(budget, 1),
                                   seed=seed, backend=None if backend == "analytical" else "tabulated:TabulatedReplay",
                                   workers=2, runs_dir=runs, study_name=study))
    wall = time.perf_counter() - start
    obj = res.objectives[0]
    best = res.answer.best[0].record
    return {"space": space, "backend": backend, "sampler": sampler, "budget": budget if sampler != "auto" or
            backend != "analytical" else "-", "seed": seed, "gap": gap(obj.value(best), optimum, obj.direction),
            "wall_s": round(wall, 2), "simulations": res.answer.simulations, "mode": res.answer.mode,
            "plan": best["plan"], "hardware": best["hardware"]}


def space_path(space: str) -> str:
    """A benchmark space's file: ``search_spaces/NAME`` is a shipped space, anything else one of spaces/."""
    return str(REPO / f"{space}.yaml" if space.startswith("search_spaces/") else SPACES / f"{space}.yaml")


def analytical_optimum(space: str) -> tuple[float, str, int, int]:
    s = load_space(space_path(space))
    census = take_census(s, HardwareCatalog(s))
    best = census.ranked(objectives_for(s.objectives), 1)[0]
    return objectives_for(s.objectives)[0].value(best.record), best.record["plan"], s.size(), len(census)


def replay_optimum(space: str) -> tuple[float, str]:
    table = json.loads((RESULTS / f"replay_{space}.json").read_text())["iteration_time_s"]
    key = min(table, key=table.get)
    return table[key], key


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["space"], r["backend"], r["sampler"], r["budget"]), []).append(r)
    out = []
    for (space, backend, sampler, budget), rs in groups.items():
        gaps = [r["gap"] for r in rs]
        out.append({"space": space, "backend": backend, "sampler": sampler, "budget": budget, "seeds": len(rs),
                    "exact": sum(g <= 1e-9 for g in gaps), "within_1pct": sum(g <= 0.01 for g in gaps),
                    "median_gap": statistics.median(gaps), "worst_gap": max(gaps),
                    "wall_s": round(statistics.mean(r["wall_s"] for r in rs), 2),
                    "simulations": round(statistics.mean(r["simulations"] for r in rs), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--only", help="one space name")
    ap.add_argument("--part", choices=("analytical", "replay", "all"), default="all")
    args = ap.parse_args()
    rows, optima = [], {}
    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    with tempfile.TemporaryDirectory() as runs:
        for space in [s for s in ANALYTICAL if (not args.only or s == args.only) and args.part != "replay"]:
            value, plan, combos, plans = analytical_optimum(space)
            optima[f"{space}/analytical"] = {"value": value, "plan": plan, "combinations": combos, "valid_plans": plans}
            for sampler, budget in ANALYTICAL_RUNS + ([("tpe", 500)] if space in TPE_500 else []):
                for seed in range(args.seeds):
                    rows.append(one_run(space, "analytical", sampler, budget, seed, value, runs))
                    print(json.dumps(rows[-1]), flush=True)
        for space in [s for s in REPLAY if (not args.only or s == args.only) and args.part != "analytical"]:
            os.environ["STAGEOPT_REPLAY_TABLE"] = str(RESULTS / f"replay_{space}.json")
            value, key = replay_optimum(space)
            optima[f"{space}/replay"] = {"value": value, "plan": key}
            for sampler, budget in REPLAY_RUNS:
                for seed in range(1 if sampler in DETERMINISTIC else args.seeds):
                    rows.append(one_run(space, "replay", sampler, budget, seed, value, runs))
                    print(json.dumps(rows[-1]), flush=True)
    summary = summarize(rows)
    name = "_".join(["decision_quality", *([args.part] if args.part != "all" else []),
                     *([args.only.replace("/", "-")] if args.only else [])])
    (RESULTS / f"{name}.json").write_text(json.dumps({"optima": optima, "summary": summary, "runs": rows},
                                                     indent=1) + "\n")
    with (RESULTS / f"{name}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    print(f"{'space':<30} {'backend':<10} {'sampler':<7} {'budget':>6} {'exact':>5} {'<=1%':>5} {'median':>8} "
          f"{'worst':>8} {'wall s':>7} {'sims':>7}")
    for s in summary:
        print(f"{s['space']:<30} {s['backend']:<10} {s['sampler']:<7} {s['budget']:>6} {s['exact']:>5} "
              f"{s['within_1pct']:>5} {s['median_gap']:8.2%} {s['worst_gap']:8.2%} {s['wall_s']:7.2f} "
              f"{s['simulations']:7.1f}")


if __name__ == "__main__":
    main()
