"""Replay's own optimum of a space: every analytically feasible plan simulated by the event replay.

The decision-quality benchmark needs the exact optimum under replay to measure
how close a budget-100 search gets. Replay is deterministic, so each plan is
simulated once here (``ReplaySimulator`` through ``simulate`` 's own path,
two processes) and the table is committed; ``tabulated.TabulatedReplay`` serves
repeats from it during the benchmark's seeds (and runs the real replay for any
plan not in it). Memory comes from the same graph as the census, so the
analytically feasible plans are the replay-feasible ones.
Run: python experiments/search/replay_table.py experiments/search/spaces/llama2-7b-64.yaml
Writes experiments/search/results/replay_<space>.json.
"""

from __future__ import annotations

import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import take_census
from stageopt.search.space import load_space
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload

HERE = Path(__file__).resolve().parent


def table_key(plan: str, gpus: int, seq: int, hardware: str) -> str:
    return f"{hardware} | gpus={gpus} | seq={seq} | {plan}"


def _one(args: tuple) -> tuple[str, float]:
    space_path, index = args
    space = load_space(space_path)
    catalog = HardwareCatalog(space)
    census = _CENSUS.get(space_path) or take_census(space, catalog)
    _CENSUS[space_path] = census
    cand = census.cands[index]
    hw = catalog.get(cand.hw_key)
    est = ReplaySimulator().evaluate(build_workload(cand.model, cand.plan, cand.gpus), hw)
    return table_key(str(cand.plan), cand.gpus, cand.model.seq, hw.name), est.iteration_time_s


_CENSUS: dict = {}


def main() -> None:
    space_path = sys.argv[1]
    space = load_space(space_path)
    census = take_census(space, HardwareCatalog(space))
    rows = [int(i) for i in census.feasible_mask.nonzero()[0]]
    start = time.perf_counter()
    table = {}
    with Pool(2) as pool:
        for n, (key, t) in enumerate(pool.imap_unordered(_one, [(space_path, r) for r in rows], chunksize=8), 1):
            table[key] = t
            if n % 50 == 0:
                print(f"{n}/{len(rows)} plans replayed, {time.perf_counter() - start:.0f} s", flush=True)
    out = HERE / "results" / f"replay_{space.name}.json"
    out.write_text(json.dumps({"space": space.name, "plans": len(rows), "wall_s": round(time.perf_counter() - start, 1),
                               "iteration_time_s": dict(sorted(table.items()))}, indent=0) + "\n")
    best = min(table, key=table.get)
    print(f"{len(rows)} plans in {time.perf_counter() - start:.0f} s; replay optimum {table[best]:.4f} s: {best}")


if __name__ == "__main__":
    main()
