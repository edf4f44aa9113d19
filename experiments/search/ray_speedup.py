"""Ray speed-up of a replay-backend search: --workers 2 against --workers 1 on the same plans.

Both runs simulate the census's top-N plans in analytical order with the event replay
(``--sampler brute --budget N``), so they do the same work in batches of one per worker. Ray start-up is excluded
(the wall time is the search loop's). Run on a machine with >= 2 free cores:
python experiments/search/ray_speedup.py [N] [space]; writes ray_speedup.json beside it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from stageopt.search.session import SearchOptions, run_search


def timed(workers: int, n: int, space: str, runs: str) -> dict:
    res = run_search(SearchOptions(space=space, backend="replay", sampler="brute", budget=n,
                                   workers=workers, runs_dir=runs, study_name=f"w{workers}"))
    return {"workers": workers, "simulations": res.answer.simulations, "loop_s": round(res.stats.elapsed_s, 2),
            "failed": res.stats.failed}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    space = sys.argv[2] if len(sys.argv) > 2 else "default"
    with tempfile.TemporaryDirectory() as runs:
        one = timed(1, n, space, runs)
        two = timed(2, n, space, runs)
    out = {"space": space, "plans": n, "one": one, "two": two, "speedup": round(one["loop_s"] / two["loop_s"], 2)}
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
