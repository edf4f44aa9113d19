"""A whole measured forward and backward step on one GPU against ``stageopt simulate``, kernel shares from the
kernels measured alone.

    python experiments/kernels/compare_step.py [experiments/kernels/h100] [--preset h100-sxm]

The step (measure_step.py: eager torchtitan-style Llama, one GPU, no communication)
is predicted through the public simulate path (``torchtitan`` for PyTorch's default
SDPA order, cuDNN first; ``torchtitan-2025`` for FlashAttention-2) twice: with the
GEMM share and fixed cost fitted to the GEMMs timed alone and the cuDNN attention
shares timed alone (compare_kernels.py), and with the preset as shipped, whose
shares are fitted to published multi-GPU runs. Nothing here is fitted to the step.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compare_kernels import HERE, attention_shares, gemm_fit, read  # noqa: E402

from stageopt.hardware import load_hardware  # noqa: E402
from stageopt.sim.run import simulate_plan  # noqa: E402

PROFILES = {"cudnn": "torchtitan", "flash": "torchtitan-2025"}  # measure_step.py --sdpa default | flash
MODELS = {4096: "llama3-8b", 8192: "llama3-70b"}


def measured_parameters(folder: pathlib.Path, preset: str, clock: float | None = None) -> list[str]:
    """``--hw-set`` strings for the kernel shares measured alone on this GPU, scaled to the SM clock ``clock``
    (MHz; None: each at the clock it ran, GEMMs at their median)."""
    hw = load_hardware(preset)
    gemms = read(folder, "gemm")
    at = float(np.median([float(r["sm_mhz"]) for r in gemms])) if clock is None or np.isnan(clock) else clock
    share, launch_us, _ = gemm_fit(hw, gemms, "bf16", at)
    shares = attention_shares(hw, read(folder, "attention"), at)
    pick = 0 if clock is None or np.isnan(clock) else 1  # (at the clock it ran, at ``at``)
    forward, backward = (np.mean([v[pick] for v in shares["cudnn", phase]]) for phase in ("fwd", "bwd"))
    return [f"gpu.efficiency.matmul.peak_fraction={share:.4f}", f"gpu.efficiency.launch_us={launch_us:.2f}",
            f"gpu.efficiency.attention_forward.peak_fraction={forward:.4f}",
            f"gpu.efficiency.attention_backward.peak_fraction={backward:.4f}"]


def predicted_compute_s(row: dict, profile: str, preset: str, hw_set: list[str]) -> float:
    model_set = [f"layers={row['layers']}", f"seq={row['seq']}"]
    _, est = simulate_plan(MODELS[int(row["hidden"])], "tp=1 pp=1 dp=1 mbs=1 gbs=1", 1, hardware=preset,
                           framework=profile, model_set=model_set, hw_set=hw_set)
    return est.time_breakdown_s["compute"]


def compare(folder: pathlib.Path, preset: str) -> list[dict]:
    """One row per measured step: measured wall seconds and the predictions with the kernel shares measured
    alone (at their own clocks, and at the step's measured SM clock) and with the preset as shipped."""
    measured_set = measured_parameters(folder, preset)
    out = []
    for sdpa, profile in PROFILES.items():
        path = folder / "step" / sdpa / "step.csv"
        if not path.exists():
            continue
        with open(path) as handle:
            for row in csv.DictReader(handle):
                wall = float(row["wall_s"])
                out.append({"config": row["config"], "attention": sdpa, "profile": profile, "measured_s": wall,
                            "step_mhz": float(row.get("sm_mhz_median") or "nan"), "gemm_s": float(row["gemm_s"]),
                            "kernels_alone_s": predicted_compute_s(row, profile, preset, measured_set),
                            "at_step_clock_s": predicted_compute_s(row, profile, preset, measured_parameters(
                                folder, preset, float(row.get("sm_mhz_median") or "nan"))),
                            "shipped_s": predicted_compute_s(row, profile, preset, [])})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=pathlib.Path, default=HERE / "h100")
    parser.add_argument("--preset", default="h100-sxm")
    args = parser.parse_args()
    print("parameters measured alone:", " ".join(measured_parameters(args.folder, args.preset)))
    gemm_mhz = np.median([float(r["sm_mhz"]) for r in read(args.folder, "gemm")])
    print(f"GEMMs alone ran at a median {gemm_mhz:.0f} MHz; 'step MHz' is the step's median SM clock")
    print(f"{'config':15s} {'attention':9s} {'step MHz':>8s} {'measured':>9s} {'kernels alone':>14s} "
          f"{'at step clock':>14s} {'shipped':>14s}")
    for r in compare(args.folder, args.preset):
        keys = ("kernels_alone_s", "at_step_clock_s", "shipped_s")
        cells = " ".join(f"{r[k]:7.4f}s {r[k] / r['measured_s'] - 1:+5.1%}" for k in keys)
        print(f"{r['config']:15s} {r['attention']:9s} {r['step_mhz']:8.0f} {r['measured_s']:8.4f}s {cells}")


if __name__ == "__main__":
    main()
