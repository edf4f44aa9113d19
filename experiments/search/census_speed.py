"""How long the exact answer takes: the census of a 147,456-combination space, and a whole `stageopt search`.

Reports wall time and CPU time (``time.process_time``: what the process itself used, which
a busy shared machine does not inflate). Target (issue 12): the exact optimum of 10^5 plans in
<= 5 s. Run: python experiments/search/census_speed.py [repeats]; writes results/census_speed.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.objective import objectives_for
from stageopt.search.space import load_space

HERE = Path(__file__).resolve().parent
SPACE = HERE / "spaces" / "llama3-405b-16k.yaml"


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    space = load_space(str(SPACE))
    take_census(space, HardwareCatalog(space))  # compile the block graphs once, as a warm process would
    runs = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        census = take_census(space, HardwareCatalog(space))
        best = census.ranked(objectives_for(space.objectives), 1)[0]
        runs.append({"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)})
        print(json.dumps(runs[-1]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "stageopt.cli", "search", "--space", str(SPACE), "--runs-dir",
                               tmp, "--no-plots", "--json"], capture_output=True, text=True, check=True)
        cli_wall = time.perf_counter() - start
        cli = json.loads(proc.stdout)
    out = {"space": space.name, "combinations": census.combos, "valid_plans": len(census),
           "merged_by_canonical_rules": census.merged, "feasible_plans": census.n_feasible,
           "census_warm": runs, "optimum": best.record["plan"],
           "cli_search_wall_s_fresh_process": round(cli_wall, 2), "cli_mode": cli["mode"],
           "cli_best": cli["best"][0]["plan"]}
    (HERE / "results" / "census_speed.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
