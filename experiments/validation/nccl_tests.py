"""The collective model against published nccl-tests curves: time and bus bandwidth per message size.

Each row of nccl_tests.csv (beside this script) is one size of a published
nccl-tests run: a hardware preset, a collective, the ranks (consecutive, 8 a
node), the NCCL release where the source names it (blank: the preset's) and the
measured time. The prediction is
:func:`stageopt.hardware.network.collective_time`, the function every backend
prices collectives with, on the preset as shipped. Bus bandwidth follows
nccl-tests' convention (all-reduce: algbw x 2(n-1)/n; all-gather and
reduce-scatter: algbw x (n-1)/n).

Prints each size and the error per size band: latency-bound (below 64 KiB),
the protocol ramp between, and bandwidth-bound (64 MiB and up), where the
training collectives of the validated runs mostly fall.

Run: python experiments/validation/nccl_tests.py [nccl_tests.csv]
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time

HERE = Path(__file__).resolve().parent
BANDS = ((64 * 2**10, "latency-bound (< 64 KiB)"), (64 * 2**20, "ramp (64 KiB - 64 MiB)"),
         (float("inf"), "bandwidth-bound (>= 64 MiB)"))


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: what each rank's link carries per byte of the buffer."""
    share = (ranks - 1) / ranks
    return 2 * share if collective == "all_reduce" else share


def band(size: int) -> str:
    return next(name for limit, name in BANDS if size < limit)


def predict(rows: list[dict]) -> list[dict]:
    """Adds the model's time (us) and both bus bandwidths (GB/s) to each row."""
    hardware = {}
    out = []
    for r in rows:
        hw = hardware.setdefault(r["hardware"], load_hardware(r["hardware"]))
        if r.get("nccl_release") and hw.nccl is not None:
            hw = dataclasses.replace(hw, nccl=dataclasses.replace(hw.nccl, release=r["nccl_release"]))
        size, ranks = int(r["bytes"]), int(r["ranks"])
        model_us = float(collective_time(hw, r["collective"], size, ranks, 1)) * 1e6
        factor = bus_factor(r["collective"], ranks)
        measured_us = float(r["time_us"])
        out.append({**r, "model_us": model_us, "error_pct": 100 * (model_us / measured_us - 1),
                    "busbw_measured": factor * size / measured_us / 1e3,
                    "busbw_model": factor * size / model_us / 1e3})
    return out


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "nccl_tests.csv"
    rows = predict(list(csv.DictReader(path.open())))
    print(f"{'source':42s} {'bytes':>12s} {'measured us':>12s} {'model us':>10s} {'error':>8s} "
          f"{'busbw GB/s':>11s} {'model':>7s}")
    by_band: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        print(f"{r['source'][:42]:42s} {int(r['bytes']):12d} {float(r['time_us']):12.1f} {r['model_us']:10.1f} "
              f"{r['error_pct']:+7.1f}% {r['busbw_measured']:11.1f} {r['busbw_model']:7.1f}")
        by_band[(r["source"], band(int(r["bytes"])))].append(r["error_pct"])
    print("\ntime error per size band (positive: the model is slower than measured)")
    for (source, name), errors in by_band.items():
        mean = sum(errors) / len(errors)
        mape = sum(abs(e) for e in errors) / len(errors)
        print(f"  {source[:42]:42s} {name:28s} {len(errors):3d} sizes  MAPE {mape:5.1f}%  mean {mean:+6.1f}%")


if __name__ == "__main__":
    main()
