"""Trace sets of every new pipeline schedule (8-64 GPUs) through the CLI: generate, validate-trace, replay.

Usage: python experiments/schedules/schedule_traces.py [--astra-sim]

For each case: ``stageopt generate`` writes the full trace set, ``stageopt validate-trace`` checks it
(dependencies, acyclicity, collective agreement, send/recv matching), ``stageopt replay`` runs it with
ASTRA-sim's congestion-unaware semantics, and ``stageopt simulate`` gives the analytical and the symmetric
replay estimates. With ``--astra-sim`` (and STAGEOPT_ASTRA_SIM set) ``simulate --backend astra-sim`` runs
the real binary too. Writes schedule_traces.csv beside this file and prints a Markdown table.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGEOPT = str(Path(sys.executable).with_name("stageopt"))
LLAMA = ["--model", "llama3-8b", "--set", "layers=16", "--set", "seq=2048"]
LLAMA14 = ["--model", "llama3-70b", "--set", "layers=14", "--set", "seq=2048"]
DSV3 = ["--model", "deepseek-v3", "--set", "layers=8", "--set", "dense_layers=1", "--set", "seq=2048"]
CASES = [  # (name, model args, plan, gpus, framework)
    ("zbh1", LLAMA, "tp=2 pp=4 mbs=1 gbs=16 schedule=zbh1", 8, "hai-llm"),
    ("zbh1 uneven", LLAMA, "tp=2 pp=4 dp=2 mbs=1 gbs=32 zero=1 schedule=zbh1 first_layers=3 last_layers=3", 16,
     "hai-llm"),
    ("zbv", LLAMA, "tp=2 pp=4 dp=2 mbs=1 gbs=32 zero=1 schedule=zbv", 16, "torchtitan"),
    ("zb2p", LLAMA, "tp=2 pp=4 dp=2 mbs=1 gbs=32 zero=1 schedule=zb2p", 16, "zero-bubble"),
    ("dualpipe", DSV3, "pp=4 ep=8 dp=8 mbs=1 gbs=128 zero=1 schedule=dualpipe", 32, "hai-llm"),
    ("dualpipev", LLAMA, "tp=2 pp=4 dp=8 mbs=1 gbs=128 zero=1 schedule=dualpipev", 64, "torchtitan"),
    ("dualpipev moe", DSV3, "pp=4 ep=8 dp=16 mbs=1 gbs=256 zero=1 schedule=dualpipev", 64, "torchtitan"),
    ("interleaved embed+loss split", LLAMA14,
     "tp=2 pp=4 vpp=2 dp=2 mbs=1 gbs=32 zero=1 schedule=interleaved embed_split=on loss_split=on", 16,
     "megatron-core"),
]


def run(args: list[str]) -> str:
    proc = subprocess.run([STAGEOPT, *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"stageopt {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def simulate(model: list[str], plan: str, gpus: int, framework: str, backend: str) -> float:
    out = run(["simulate", *model, "--plan", plan, "--gpus", str(gpus), "--framework", framework,
               "--hardware", "h100-sxm", "--backend", backend, "--json"])
    return float(json.loads(out)["iteration_time_s"])


def one_case(name: str, model: list[str], plan: str, gpus: int, framework: str, astra: bool) -> dict:
    row: dict[str, object] = {"case": name, "gpus": gpus, "plan": plan, "framework": framework}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run(["generate", *model, "--plan", plan, "--gpus", str(gpus), "--framework", framework,
             "--hardware", "h100-sxm", "--out", tmp])
        row["generate_s"] = round(time.perf_counter() - start, 2)
        run(["validate-trace", "--strict", tmp])  # exits non-zero (and stops the script) on any violation
        row["validate"] = "ok (strict)"
        replay = json.loads(run(["replay", "--workload", f"{tmp}/workload", "--comm-group", f"{tmp}/comm_groups.json",
                                 "--system", f"{tmp}/system.json", "--network", f"{tmp}/network.yml", "--json"]))
        row["replay_compat_s"] = replay["max_cycles"] / 1e9
        row["files"] = replay["ranks"]
    row["analytical_s"] = simulate(model, plan, gpus, framework, "analytical")
    row["replay_s"] = simulate(model, plan, gpus, framework, "replay")
    if astra:
        row["astra_sim_s"] = simulate(model, plan, gpus, framework, "astra-sim")
    return row


def main() -> int:
    astra = "--astra-sim" in sys.argv and bool(os.environ.get("STAGEOPT_ASTRA_SIM"))
    rows = [one_case(*case, astra=astra) for case in CASES]
    keys = list(rows[0])
    with open(HERE / "schedule_traces.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.4f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
