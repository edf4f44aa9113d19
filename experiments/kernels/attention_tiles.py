"""How a fused attention kernel's speed depends on its shape: cuDNN's own SDPA benchmark against the kernel model.

``cudnn_sdpa_shapes.csv`` is NVIDIA/cudnn-frontend's training-shape SDPA benchmark (BF16, cuDNN backend):
one H200 with cuDNN 9.19 (results/h200_919_only_cudnn @df73764, clocks locked) and one GB200 with cuDNN 9.22
(results/*/gb200 @fb682ce): Llama 3.1, DeepSeek-V3 / Kimi (head dims 192 + 128), Qwen 3.5 (256), GPT-OSS
(64, sliding windows of 1,024 and 128 keys), video models (unmasked), 2K to 75K tokens, forward and backward.

For each GPU and pass this fits the two numbers the kernel model (stageopt.hardware.kernels) has for an
attention kernel, its share of peak and the fixed cost of each of its tiles (``tile_us``), by pricing every
benchmark kernel through ``kernel_seconds`` on the GPU's preset, and prints the error with the share alone:

    python experiments/kernels/attention_tiles.py        # ~5 s, no GPU

The shares it finds belong to the benchmark's clocks and kernel alone; training runs fit their own
(experiments/validation/calibrate.py). The tile costs are what the presets take.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from stageopt.hardware import load_hardware
from stageopt.hardware.kernels import KERNEL_CODES, Kernels, kernel_seconds

HERE = Path(__file__).parent
PRESETS = {"H200": "h200-sxm", "GB200": "gb200-nvl72"}


def load_rows(path: Path = HERE / "cudnn_sdpa_shapes.csv", gpu: str | None = None,
              phase: str | None = None) -> list[dict]:
    """The benchmark's rows (of one GPU and pass if given); GB200's deterministic backward runs are left out
    where the default one ran."""
    rows = [r for r in csv.DictReader(open(path)) if not (r["gpu"] == "GB200" and r["deterministic"] == "True")]
    return [r for r in rows if gpu in (None, r["gpu"]) and phase in (None, r["pass"])]


def benchmark_kernels(rows: list[dict]) -> Kernels:
    """The rows as the graph describes an attention kernel: model FLOPs over the whole (masked: banded)
    matrix, keys a query row keeps, mask edges, FLOPs per score (stageopt.graph.tensor.score_shape)."""
    b, s, h, dqk, dv, w = (np.array([float(r[k]) for r in rows]) for k in
                           ("batch", "seq", "q_heads", "head_dim_qk", "head_dim_v", "window"))
    masked = np.array([r["mask"] != "no_mask" for r in rows])
    window = np.where(w > 0, np.minimum(w, s), s)
    band = np.where(w > 0, (2 * window * s - window**2) / s**2, 1.0)
    keys = np.where(masked, band * s / 2, s)
    edges = np.where(w > 0, 2.0, np.where(masked, 1.0, 0.0))
    backward = np.array([r["pass"] == "bwd" for r in rows])
    per_score = 2 * (dqk + dv) * np.where(backward, 2, 1)
    flops = b * h * s * s * 2 * (dqk + dv) * band * np.where(backward, 2, 1)
    zero = np.zeros(len(rows))
    code = np.where(masked, KERNEL_CODES["attention_causal"], KERNEL_CODES["attention"])
    return Kernels(code=code, flops=flops, nbytes=zero, m=edges, n=keys, k=per_score, batch=zero,
                   precision=zero, backward=backward)


def priced(preset: str, share: float, tile_us: float, kern: Kernels) -> np.ndarray:
    hw = load_hardware(preset)
    eff = hw.gpu.efficiency
    one = dataclasses.replace(eff.attention_forward, peak_fraction=share, tile_us=tile_us)
    eff = dataclasses.replace(eff, attention_forward=one, attention_backward=one)
    return kernel_seconds(dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, efficiency=eff)), "bf16", kern)


def fit(preset: str, rows: list[dict], with_tiles: bool) -> tuple[float, float, np.ndarray]:
    """Share (and tile cost) minimizing the mean absolute error; returns them and the errors."""
    kern = benchmark_kernels(rows)
    measured = np.array([float(r["time_ms"]) * 1e-3 for r in rows])

    def errors(x):
        share, tile_us = (x[0], x[1]) if with_tiles else (x[0], 0.0)
        if not 0.2 < share <= 0.95 or tile_us < 0:
            return np.full(len(rows), 10.0)
        return priced(preset, share, tile_us, kern) / measured - 1

    start = [0.6, 3.0] if with_tiles else [0.6]
    best = minimize(lambda x: np.mean(np.abs(errors(x))), start, method="Nelder-Mead")
    x = best.x
    return float(x[0]), float(x[1]) if with_tiles else 0.0, errors(x)


def main() -> None:
    print("| GPU | pass | kernels | share alone: share, MAPE (worst) | share + tile cost: share, tile_us, MAPE (worst) |")
    print("| --- | --- | --- | --- | --- |")
    for gpu, preset in PRESETS.items():
        for phase in ("fwd", "bwd"):
            sel = load_rows(gpu=gpu, phase=phase)
            a, _, ea = fit(preset, sel, False)
            b, tile, eb = fit(preset, sel, True)
            print(f"| {gpu} | {phase} | {len(sel)} | {a:.3f}, {100 * np.mean(np.abs(ea)):.1f}% "
                  f"({100 * np.max(np.abs(ea)):.0f}%) | {b:.3f}, {tile:.1f}, {100 * np.mean(np.abs(eb)):.1f}% "
                  f"({100 * np.max(np.abs(eb)):.0f}%) |")


if __name__ == "__main__":
    main()
