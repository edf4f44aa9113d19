"""Iteration time of the same plans under every backend: ASTRA-sim (unaware, aware), replay, analytical.

Usage: STAGEOPT_ASTRA_SIM=/path/to/AstraSim_Analytical_Congestion_Unaware \\
       python experiments/simulators/astrasim_agreement.py [--commit 518bd51] [--only NAME ...]

Every number comes from ``stageopt.sim.run.simulate_plan``, the path ``stageopt
simulate`` takes, for the plans in ``agreement_matrix.yaml``. Columns:
ASTRA-sim congestion-unaware; the replay under ASTRA-sim's rules (one
communication slot and whole TP collectives after the GEMMs, chunked where the
plan's userbuffer overlap chunks them: ``--dp-stream shared``) and as it
runs by default; analytical; ASTRA-sim congestion-aware where the network is
1-D (one scale-up domain). Differences are relative to ASTRA-sim unaware. The notes
column lists the by-design differences the astra-sim backend names for the
plan. Prints a Markdown table and writes ``astrasim_agreement.csv`` beside
this file.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import yaml

from stageopt.astrasim.config_writer import network_dims
from stageopt.hardware import load_hardware
from stageopt.sim.astrasim_backend import AstraSimSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan

HERE = Path(__file__).resolve().parent
SHORT_NOTES = {"data-parallel collectives": "dp-stream", "tp_overlap=on": "tp-overlap", "several nodes": "spanning",
               "as a ring (": "ring-only", "pods": "pods", "ep_overlap:": "a2a-contention",
               "congestion-aware": "aware"}


def _short(notes: list[str]) -> str:
    return ",".join(v for k, v in SHORT_NOTES.items() if any(k in n for n in notes) and v != "aware") or "-"


def measure(row: dict, timeout_s: float) -> dict:
    args = (row["model"], row["plan"], row["gpus"])
    out: dict = {"name": row["name"], "plan": row["plan"], "gpus": row["gpus"]}
    start = time.perf_counter()
    _, astra = simulate_plan(*args, simulator=AstraSimSimulator(timeout_s=timeout_s))
    out["astra_s"], out["astra_wall_s"] = astra.iteration_time_s, time.perf_counter() - start
    out["notes"] = _short(astra.details["notes"])
    out["exit_fault"] = astra.details["known_exit_fault"]
    _, shared = simulate_plan(*args, simulator=ReplaySimulator(dp_stream="shared"))
    _, replay = simulate_plan(*args, simulator=ReplaySimulator())
    _, analytical = simulate_plan(*args)
    out["replay_shared_s"], out["replay_s"], out["analytical_s"] = (
        shared.iteration_time_s, replay.iteration_time_s, analytical.iteration_time_s)
    out["aware_s"] = None
    if len(network_dims(load_hardware("h100-sxm"), row["gpus"])) == 1:
        _, aware = simulate_plan(*args, simulator=AstraSimSimulator(timeout_s=timeout_s, network="aware"))
        out["aware_s"] = aware.iteration_time_s
    return out


def _pct(value: float | None, ref: float) -> str:
    return "n/a" if value is None else f"{value:.4f} ({100 * (value / ref - 1):+.2f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="518bd51", help="the ASTRA-sim commit the binary was built from")
    parser.add_argument("--only", nargs="*", help="matrix rows to run (default: all)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per ASTRA-sim run (default 3600)")
    args = parser.parse_args()
    rows = yaml.safe_load((HERE / "agreement_matrix.yaml").read_text())
    rows = [r for r in rows if not args.only or r["name"] in args.only]
    print(f"ASTRA-sim {args.commit}, analytical backend; h100-sxm; iteration time in s (difference to ASTRA-sim "
          "unaware)\n")
    print("| plan | GPUs | ASTRA-sim unaware | replay, ASTRA-sim rules | replay (default) | analytical | "
          "ASTRA-sim aware | named differences | ASTRA-sim wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = []
    for row in rows:
        r = measure(row, args.timeout)
        results.append(r)
        a = r["astra_s"]
        print(f"| {r['name']}: `{r['plan']}` | {r['gpus']} | {a:.4f} | {_pct(r['replay_shared_s'], a)} | "
              f"{_pct(r['replay_s'], a)} | {_pct(r['analytical_s'], a)} | {_pct(r['aware_s'], a)} | "
              f"{r['notes']}{' +exit-fault' if r['exit_fault'] else ''} | {r['astra_wall_s']:.1f} |", flush=True)
    if not args.only:
        with (HERE / "astrasim_agreement.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
