"""How often does `stageopt search --sampler tpe --budget 500` find the exhaustive optimum of the default space?

(Since the exact census, plain `stageopt search` returns that optimum without sampling; this script
keeps measuring the TPE sampler on its own. See decision_quality.py for every sampler and space.)

The optimum comes from the census (every valid plan enumerated and scored by the
analytical model in one vectorized pass, independent of any sampler); each seed
runs the real search (TPE, journal storage) and is a hit when its best plan is
within 1% of that optimum. Run: python experiments/search/optimum_over_seeds.py [seeds] [budget]
Writes experiments/search/optimum_over_seeds.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from stageopt.search.artifacts import study_best
from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.session import SearchOptions, run_search
from stageopt.search.space import load_space


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    space = load_space("default")
    census = take_census(space, HardwareCatalog(space))
    optimum = min(census.feasible, key=lambda o: o.record["iteration_time_s"]).record
    rows = []
    with tempfile.TemporaryDirectory() as runs:
        for seed in range(seeds):
            start = time.perf_counter()
            res = run_search(SearchOptions(budget=budget, seed=seed, sampler="tpe", runs_dir=runs,
                                           study_name=f"seed{seed}"))
            best = study_best(res.study, res.objectives, res.backend)[0].record
            gap = best["iteration_time_s"] / optimum["iteration_time_s"] - 1
            rows.append({"seed": seed, "best_time_s": best["iteration_time_s"], "gap": gap, "hit": gap <= 0.01,
                         "asks": res.stats.asks, "wall_s": round(time.perf_counter() - start, 2), "plan": best["plan"]})
            print(json.dumps(rows[-1]), flush=True)
    out = {"space": "default", "budget": budget, "optimum_time_s": optimum["iteration_time_s"],
           "optimum_plan": optimum["plan"], "valid_plans": len(census), "feasible_plans": census.n_feasible,
           "hits": sum(r["hit"] for r in rows), "seeds": seeds, "runs": rows}
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"hits {out['hits']}/{seeds} within 1% of {optimum['iteration_time_s']:.4f} s ({optimum['plan']})")


if __name__ == "__main__":
    main()
