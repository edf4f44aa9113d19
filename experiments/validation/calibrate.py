"""Fit one set of kernel-efficiency parameters per GPU type to the published runs.

Fits, per GPU preset, the GEMM asymptotic fraction of peak, the per-kernel overhead
and the achievable HBM fraction (attention fractions scale with the GEMM one) by
minimizing the mean absolute percentage error over every row of that GPU in
../shared/validation/published_runs.csv. No per-row tuning. Prints the values to
put in simulators/hardware/<preset>.yaml.

Run: python experiments/validation/calibrate.py [path/to/published_runs.csv]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from stageopt.hardware import load_hardware
from stageopt.validation import load_cases, mape, predict

DEFAULT_CSV = Path(__file__).resolve().parents[3] / "shared" / "validation" / "published_runs.csv"


def overrides(preset: str, x: np.ndarray) -> list[str]:
    fraction, overhead, memory = x
    base = load_hardware(preset).gpu.efficiency
    scale = fraction / base.matmul.peak_fraction
    return [f"gpu.efficiency.matmul.peak_fraction={fraction}",
            f"gpu.efficiency.matmul.overhead_us={overhead}",
            f"gpu.efficiency.attention_forward.peak_fraction={min(base.attention_forward.peak_fraction * scale, 1)}",
            f"gpu.efficiency.attention_backward.peak_fraction={min(base.attention_backward.peak_fraction * scale, 1)}",
            f"gpu.efficiency.attention_forward.overhead_us={overhead}",
            f"gpu.efficiency.attention_backward.overhead_us={overhead * 1.5}",
            f"gpu.efficiency.memory_fraction={memory}"]


def fit(preset: str, cases) -> np.ndarray:
    measured = np.array([c.measured_tflops for c in cases])
    eff = load_hardware(preset).gpu.efficiency

    def loss(x: np.ndarray) -> float:
        x = np.clip(x, [0.3, 0.0, 0.3], [0.95, 200.0, 0.95])
        return mape(predict(cases, {preset: overrides(preset, x)}), measured)

    start = np.array([eff.matmul.peak_fraction, eff.matmul.overhead_us, eff.memory_fraction])
    best = minimize(loss, start, method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-3, "maxiter": 120})
    return np.clip(best.x, [0.3, 0.0, 0.3], [0.95, 200.0, 0.95])


def main() -> None:
    csv_path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CSV
    cases = load_cases(csv_path)
    for preset in sorted({c.hardware for c in cases}):
        rows = [c for c in cases if c.hardware == preset]
        x = fit(preset, rows)
        measured = np.array([c.measured_tflops for c in rows])
        print(f"{preset}: {len(rows)} rows, MAPE before "
              f"{mape(predict(rows), measured):.1f}%, after {mape(predict(rows, {preset: overrides(preset, x)}), measured):.1f}%")
        for item in overrides(preset, x):
            print("   ", item)


if __name__ == "__main__":
    main()
