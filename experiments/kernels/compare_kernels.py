"""Price the kernels measured on a real GPU with stageopt's kernel model, and print how well it fits.

    python experiments/kernels/compare_kernels.py [experiments/kernels/h200] [--preset h200-sxm]

What it checks (measurements from measure_kernels.py, taken on one GPU under a
warm-up load, each time scaled to the run's median SM clock):

* GEMMs: the shape curve. Over every GEMM slower than 40 us (faster ones are
  bound by the Python loop that launched them) it fits the two parameters an
  isolated GEMM pins down (the full-tile share of peak and the fixed cost per
  kernel; a robust loss, as a few timings are disturbed) and prints the
  remaining error of stageopt's model beside the
  variants it replaced: one fixed 128x256 tile, no output-store term, and no
  quantization at all.
* Streaming kernels: the HBM share a large copy reaches (``memory_fraction``).
* Attention: the share of peak the fused kernels reach (FlashAttention-2's are the
  presets' ``attention_*.fa2_peak_fraction``), and FlashAttention-2 against cuDNN's kernel.
* Grouped expert GEMMs, priced with the preset as shipped.
* The sustained rate and clock of a large GEMM under the power limit: the
  ceiling for any fitted ``matmul.peak_fraction``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import pathlib

import numpy as np
from scipy.optimize import least_squares

from stageopt.hardware import load_hardware
from stageopt.hardware.efficiency import gemm_padded_flops
from stageopt.hardware.kernels import HIGH, LOWP, Kernels, kernel_seconds

HERE = pathlib.Path(__file__).resolve().parent
HOST_BOUND_S = 40e-6  # below this a Python loop, not the GPU, set the pace (~15 us per F.linear call)


def read(folder: pathlib.Path, table: str) -> list[dict]:
    with open(folder / f"{table}.csv") as handle:
        return list(csv.DictReader(handle))


def at_clock(rows: list[dict], seconds_field: str, clock: float) -> np.ndarray:
    """Times scaled to one SM clock: the power limit moves the clock from one measurement to the next."""
    return np.array([float(r[seconds_field]) * float(r["sm_mhz"]) / clock for r in rows])


def gemm_kernels(rows: list[dict], dtype: str) -> Kernels:
    m, n, k = (np.array([float(r[f]) for r in rows]) for f in "mnk")
    operand = 2.0 if dtype == "bf16" else 1.0
    precision = np.full(len(rows), LOWP if dtype != "bf16" else HIGH)
    return Kernels(code=np.zeros(len(rows), int), flops=2 * m * n * k, nbytes=operand * (m * k + n * k) + 2 * m * n,
                   m=m, n=n, k=k, batch=np.ones(len(rows)), precision=precision, backward=np.zeros(len(rows), bool))


def with_gemm_parameters(hw, share: float, launch_us: float, dtype: str):
    eff = hw.gpu.efficiency
    matmul = dataclasses.replace(eff.matmul, **({"peak_fraction": share} if dtype == "bf16" else
                                                {"fp8_peak_fraction": share}))
    gpu = dataclasses.replace(hw.gpu, efficiency=dataclasses.replace(eff, matmul=matmul, launch_us=launch_us,
                                                                     host_us=0.0))
    return dataclasses.replace(hw, gpu=gpu)


def variant_seconds(hw, dtype: str, kern: Kernels, variant: str, share: float, launch_us: float) -> np.ndarray:
    """A GEMM's time under stageopt's model or one of the variants it replaced."""
    if variant == "stageopt":
        return kernel_seconds(with_gemm_parameters(hw, share, launch_us, dtype), dtype, kern)
    gpu = hw.gpu
    rate = share * gpu.sustained_peak(dtype) * 1e12
    bandwidth = gpu.hbm_gbps * 1e9 * gpu.efficiency.memory_fraction
    padded = {"one 128x256 tile, no store": gemm_padded_flops(kern.m, kern.n, kern.k, 1, 128, 256, gpu.sm_count),
              "no quantization, no store": kern.flops}[variant]
    return launch_us * 1e-6 + np.maximum(padded / rate, kern.nbytes / bandwidth)


def gemm_fit(hw, rows: list[dict], dtype: str, clock: float, variant: str = "stageopt"):
    """(share, fixed cost in us, absolute errors) of one model fitted to the GEMMs slower than the host bound."""
    rows = [r for r in rows if r["dtype"] == dtype and float(r["seconds"]) > HOST_BOUND_S]
    measured, kern = at_clock(rows, "seconds", clock), gemm_kernels(rows, dtype)
    fit = least_squares(lambda p: np.log(variant_seconds(hw, dtype, kern, variant, p[0], p[1]) / measured),
                        [0.6, 5.0], bounds=([0.3, 0.0], [1.0, 20.0]), loss="soft_l1", f_scale=0.05)
    return fit.x[0], fit.x[1], np.abs(variant_seconds(hw, dtype, kern, variant, *fit.x) / measured - 1)


def fit_gemms(hw, rows: list[dict], dtype: str, clock: float) -> list[str]:
    lines = []
    for variant in ("stageopt", "one 128x256 tile, no store", "no quantization, no store"):
        share, launch, error = gemm_fit(hw, rows, dtype, clock, variant)
        lines.append(f"  {dtype} {variant:27s} share {share:.3f} launch {launch:4.1f} us | "
                     f"MAPE {np.mean(error) * 100:4.1f}%  p95 {np.percentile(error, 95) * 100:3.0f}%  "
                     f"worst {np.max(error) * 100:3.0f}%  ({len(error)} GEMMs)")
    return lines


def attention_shares(hw, rows: list[dict], clock: float) -> dict:
    """{(backend, phase): [(share at the clock it ran, share at ``clock``), ...]} over causal head-dim-128
    attention at 4K-32K tokens (executed FLOPs, exponentials priced apart as the model does: cuDNN's under its
    matmuls by the preset's ``exp_overlap``, the longer part; FlashAttention-2's and the others' after them;
    cuDNN's fixed cost per 128-row tile, the preset's ``tile_us``, taken off as well)."""
    peak = hw.gpu.sustained_peak("bf16") * 1e12
    exp_rate = hw.gpu.exp_tops * 1e12
    shares = {}
    for r in rows:
        b, h, s, d, causal = (int(r[f]) for f in ("batch", "heads", "seq", "head_dim", "causal"))
        if not causal or s < 4096:
            continue
        flops, scores = 4 * b * h * s * s * d / 2, b * h * s * s / 2
        cudnn = r["backend"] == "cudnn"
        exposed = (1 - hw.gpu.efficiency.exps_hidden("best" if cudnn else "fa2")) * scores / exp_rate
        for phase, executed in (("fwd", flops), ("bwd", 2.5 * flops)):
            kernel = hw.gpu.efficiency.attention_backward if phase == "bwd" else hw.gpu.efficiency.attention_forward
            tiles = b * h * s / 128 * (kernel.tile_us if cudnn else 0.0) * 1e-6 / hw.gpu.sm_count  # fixed tile costs
            raw = float(r[f"{phase}_seconds"]) - exposed - tiles
            scaled = float(r[f"{phase}_seconds"]) * float(r["sm_mhz"]) / clock - exposed - tiles
            shares.setdefault((r["backend"], phase), []).append((executed / raw / peak, executed / scaled / peak))
    return shares


def attention_lines(hw, rows: list[dict], clock: float) -> list[str]:
    shares = attention_shares(hw, rows, clock)
    ran = np.median([float(r["sm_mhz"]) for r in rows if int(r["causal"]) and int(r["seq"]) >= 4096])
    lines = [f"  seq 4K-32K, causal; at the clock it ran (median {ran:.0f} MHz) / at {clock:.0f} MHz:"]
    lines += [f"  {backend:9s} {phase}: {np.mean([v[0] for v in vals]):.3f} / {np.mean([v[1] for v in vals]):.3f}"
              for (backend, phase), vals in sorted(shares.items())]
    for phase in ("fwd", "bwd"):
        if ("flash2", phase) in shares and ("cudnn", phase) in shares:
            ratio = np.mean([f[0] / c[0] for f, c in zip(shares["flash2", phase], shares["cudnn", phase])])
            lines.append(f"  FlashAttention-2 / cuDNN {phase}: {ratio:.2f}")
    return lines


def grouped_lines(hw, rows: list[dict]) -> list[str]:
    """Grouped expert GEMMs priced as stageopt prices them (a batch of equal GEMMs, the preset as shipped)."""
    e, m, n, k = (np.array([float(r[f]) for r in rows]) for f in ("experts", "tokens_per_expert", "n", "k"))
    kern = Kernels(code=np.zeros(len(rows), int), flops=2 * e * m * n * k, nbytes=2 * e * (m * k + n * k + m * n),
                   m=m, n=n, k=k, batch=e, precision=np.full(len(rows), HIGH), backward=np.zeros(len(rows), bool))
    ratio = kernel_seconds(hw, "bf16", kern) / np.array([float(r["seconds"]) for r in rows])
    small, large = m <= 128, m >= 512
    return [f"  16-128 tokens per expert: model / measured {np.min(ratio[small]):.2f}-{np.max(ratio[small]):.2f}; "
            f"512-2048: {np.min(ratio[large]):.2f}-{np.max(ratio[large]):.2f} ({len(rows)} grouped GEMMs, "
            f"{int(e.min())}-{int(e.max())} experts)"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=pathlib.Path, default=HERE / "h200")
    parser.add_argument("--preset", default="h200-sxm")
    args = parser.parse_args()
    hw = load_hardware(args.preset)
    device = json.loads((args.folder / "device.json").read_text())
    gemms = read(args.folder, "gemm")
    clock = float(np.median([float(r["sm_mhz"]) for r in gemms]))
    sustained = [r for r in read(args.folder, "sustained") if float(r["elapsed_s"]) > 1.0]
    rate = np.median([float(r["tflops"]) for r in sustained])
    held = np.median([float(r["sm_mhz"]) for r in sustained])
    print(f"{device['name']} ({device['sm_count']} SMs, driver {device.get('driver')}, torch {device['torch']}), "
          f"times at its median clock under load, {clock:.0f} MHz (max {device.get('max_sm_mhz')})")
    print(f"sustained 8192^3 BF16 GEMM at the {device.get('power_limit_w')} W limit: {rate:.0f} TFLOP/s at "
          f"{held:.0f} MHz = {rate / hw.gpu.peak('bf16') / 1e3 * 1e3:.3f} of the datasheet peak "
          f"(preset's fitted share: {hw.gpu.efficiency.matmul.peak_fraction})")
    print("GEMMs, two parameters fitted per model (log error):")
    for dtype in ("bf16", "fp8"):
        print("\n".join(fit_gemms(hw, gemms, dtype, clock)))
    copies = [r for r in read(args.folder, "memory") if r["op"] == "copy" and int(r["bytes"]) >= 2 ** 30]
    reached = np.median([float(r["gbps"]) for r in copies]) / hw.gpu.hbm_gbps
    print(f"copy of 1-4 GiB: {reached:.3f} of {hw.gpu.hbm_gbps:.0f} GB/s (preset memory_fraction "
          f"{hw.gpu.efficiency.memory_fraction})")
    fwd, bwd = hw.gpu.efficiency.attention_forward, hw.gpu.efficiency.attention_backward
    scale = hw.gpu.efficiency.fa2_attention_scale
    print(f"attention (preset: best fwd {fwd.peak_fraction}, bwd {bwd.peak_fraction}; FlashAttention-2 fwd "
          f"{fwd.fa2_peak_fraction}, bwd {bwd.fa2_peak_fraction}, else {scale} x best):")
    print("\n".join(attention_lines(hw, read(args.folder, "attention"), clock)))
    print("grouped expert GEMMs (torch._grouped_mm), the preset's parameters as shipped:")
    print("\n".join(grouped_lines(hw, read(args.folder, "grouped"))))


if __name__ == "__main__":
    main()
