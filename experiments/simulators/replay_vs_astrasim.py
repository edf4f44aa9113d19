"""Compare stageopt's event replay with ASTRA-sim's recorded runs.

Usage: python experiments/simulators/replay_vs_astrasim.py [SHARED_DIR]

Reads shared/reference/astra-sim/results.json, extracts the reference traces
into a temporary folder, replays every run and prints one table row per run:
ASTRA-sim's step time, ours, the error, and whether every rank's finish time
and exposed communication match to the cycle. Congestion-aware runs are shown
against our (congestion-unaware) replay to say how much congestion adds.
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from stageopt.astrasim.trace_replay import replay_trace_set


def main(shared: Path) -> int:
    ref = shared / "reference"
    runs = json.loads((ref / "astra-sim" / "results.json").read_text())
    configs = ref / "astra-sim" / "configs"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("stage_8gpu.tar.gz", "astrasim_microbench_8npus.tar.gz"):
            with tarfile.open(ref / "traces" / name) as tar:
                tar.extractall(root, filter="data")
        header = f"| {'run':<55} | {'binary':<9} | {'ASTRA-sim max':>13} | {'replay max':>13} | {'error %':>8} | per-rank exact | time s |"
        print(header)
        print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
        for run, spec in sorted(runs.items()):
            groups = root / spec["comm_groups"] if spec.get("comm_groups") else None
            start = time.perf_counter()
            result = replay_trace_set(root / spec["workload"], groups, configs / spec["system"], configs / spec["network"])
            elapsed = time.perf_counter() - start
            ours = result.to_dict()
            err = 100.0 * (ours["max_cycles"] - spec["max_cycles"]) / spec["max_cycles"]
            exact = (ours["per_rank_cycles"] == spec["per_rank_cycles"]
                     and ours["per_rank_exposed_comm"] == spec["per_rank_exposed_comm"])
            kind = "aware" if spec["binary"].endswith("_Congestion_Aware") else "unaware"
            print(f"| {run:<55} | {kind:<9} | {spec['max_cycles']:>13} | {ours['max_cycles']:>13} | {err:>+8.3f} | "
                  f"{'yes' if exact else 'no':<14} | {elapsed:>6.2f} |")
    return 0


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[2].parent / "shared"
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
