"""Fit the few kernel-model parameters of a GPU family to published runs, and say how well that generalizes.

Why only a few, and only inside their physical ranges: HBM and network
efficiencies come from microbenchmarks and stay fixed; what is fitted is the
share of peak a large GEMM reaches at the clocks a GPU holds in training (BF16
and FP8), the flash-attention kernels' matmul share of peak (their softmax
exponentials are priced apart, on the special-function units; backward tied to
forward by the throughput ratio the FlashAttention papers report at head dim
128, exponentials included), the per-kernel launch cost on the GPU
and the host's dispatch time per kernel. Each
is bounded by its physical range (:data:`PARAMETERS`) and, where a GPU family's
kernels were timed alone, by what they reached (:data:`MEASURED_CEILINGS`), so a
missing term in the model shows up as a large error, not as a parameter that
absorbs it.

Honesty: :func:`leave_one_source_out` refits without each source in turn and
predicts that source, which is the error to expect on runs the fit has never
seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, lsq_linear

from stageopt.errors import StageoptError
from stageopt.hardware.machine import Gpu
from stageopt.validation.compare import Comparison, PreparedRun, predict

# (hw-set key, low, high): the physical range of each fitted parameter.
PARAMETERS: tuple[tuple[str, float, float], ...] = (
    ("gpu.efficiency.matmul.peak_fraction", 0.55, 0.90),
    ("gpu.efficiency.matmul.fp8_peak_fraction", 0.45, 0.90),
    ("gpu.efficiency.attention_forward.peak_fraction", 0.40, 0.85),
    ("gpu.efficiency.launch_us", 1.0, 10.0),
    ("gpu.efficiency.host_us", 0.0, 30.0),
)
# What the same kernels reach alone on one GPU under load (experiments/kernels/: H100 and H200, PyTorch 2.11,
# CUDA 13): the GEMM full-tile shares with the output store priced apart, and cuDNN's fused attention forward at
# the clock it ran. A fit to training runs must stay at or below them. A100 (not timed here): FlashAttention-2's
# forward reaches at most 73% of the A100's peak (Dao 2023, arXiv 2307.08691: "50-73% of the theoretical maximum").
MEASURED_CEILINGS: dict[str, dict[str, float]] = {
    "hopper": {"gpu.efficiency.matmul.peak_fraction": 0.731, "gpu.efficiency.matmul.fp8_peak_fraction": 0.721,
               "gpu.efficiency.attention_forward.peak_fraction": 0.611},
    "a100": {"gpu.efficiency.attention_forward.peak_fraction": 0.73},
}
# Flash-attention backward vs forward throughput (executed FLOPs, head dim 128), by the kernel a family's "best"
# share describes. A100 (FlashAttention-2) and GPUs not measured: 0.75, the FlashAttention-2/3 papers. Hopper
# (cuDNN): 0.84, what its kernel reaches alone (experiments/kernels/: 0.494 / 0.574 on an H100 and 0.506 / 0.611
# on an H200 under PyTorch 2.11, 0.613 / 0.731 in cuDNN's own H200 benchmark: 0.86, 0.83, 0.84). Blackwell
# (cuDNN): 0.71, cuDNN's own GB200 benchmark (0.504 / 0.712, `python experiments/kernels/attention_tiles.py`).
BACKWARD_TO_FORWARD = 0.75
MEASURED_BACKWARD_TO_FORWARD: dict[str, float] = {"hopper": 0.84, "blackwell": 0.71}
REFERENCE_HEAD_DIM = 128  # the head dim of those papers' headline throughputs
FAMILIES: dict[str, tuple[str, ...]] = {
    "a100": ("a100-80g", "a100-80g-jeanzay"),
    "hopper": ("h100-sxm", "h100-grand-teton", "h200-sxm"),
    "blackwell": ("b200", "gb200-nvl72", "gb300-nvl72"),
}


def hw_set_for(values: Sequence[float], keys: Sequence[str], gpu: Gpu) -> list[str]:
    """``--hw-set`` strings for fitted ``values`` (attention backward follows forward)."""
    out = [f"{k}={v:.6g}" for k, v in zip(keys, values)]
    for k, v in zip(keys, values):
        if k.endswith("attention_forward.peak_fraction"):
            out.append(f"gpu.efficiency.attention_backward.peak_fraction={backward_share(v, gpu):.6g}")
    return out


def backward_to_forward(gpu: Gpu) -> float:
    """The backward/forward throughput ratio of ``gpu``'s best attention kernel (:data:`BACKWARD_TO_FORWARD`)."""
    return MEASURED_BACKWARD_TO_FORWARD.get(family_of_gpu(gpu), BACKWARD_TO_FORWARD)


def backward_share(forward: float, gpu: Gpu) -> float:
    """The backward kernel's matmul share of peak that keeps its kernel's backward/forward throughput
    ratio at head dim 128 (:func:`backward_to_forward`), now that the kernel model prices the softmax
    exponentials apart.

    Per forward model FLOP the exponentials take ``r = peak / (4 d exp_rate)`` of peak time; the
    backward kernel computes the same scores' exponentials over 2.5x the FLOPs (0.4 r per FLOP). The
    share ``exp_overlap`` of whichever is shorter, matmuls or exponentials, runs under the other; in the
    backward the matmuls are the longer at every share in range.
    """
    r = gpu.peak("bf16") / (4 * REFERENCE_HEAD_DIM * gpu.exp_tops) if gpu.exp_tops else 0.0
    hidden = gpu.efficiency.exps_hidden("best")
    inclusive_forward = 1 / (1 / forward + r - hidden * min(1 / forward, r))
    return 1 / (1 / (backward_to_forward(gpu) * inclusive_forward) - (1 - hidden) * 0.4 * r)


# GPU names (as hardware files spell them) of each family, for files that are not one of its presets.
FAMILY_GPUS: dict[str, tuple[str, ...]] = {"a100": ("A100",), "hopper": ("H100", "H200"),
                                           "blackwell": ("B200", "GB200", "B300", "GB300")}


def gpu_family(run: PreparedRun) -> str | None:
    """The GPU family of a row: by its hardware preset's name, else by the GPU name in its hardware file."""
    for family, presets in FAMILIES.items():
        if run.run.hardware in presets:
            return family
    return family_of_gpu(run.hardware.gpu)


def family_of_gpu(gpu: Gpu) -> str | None:
    """The GPU family a GPU's name says (:data:`FAMILY_GPUS`); None for a GPU of no calibrated family."""
    name = gpu.name.upper().split()
    return next((f for f, gpus in FAMILY_GPUS.items() if any(g in name for g in gpus)), None)


def fitted_ranges(runs: Sequence[PreparedRun]) -> list[tuple[str, float, float]]:
    """(key, low, high) of each parameter the rows can fit: the physical range, capped by what the kernels
    reach alone where the rows' GPU family was measured (:data:`MEASURED_CEILINGS`)."""
    fp8 = any(p.work.plan.dtype == "fp8" for p in runs)
    families = {gpu_family(p) for p in runs}
    ceilings = MEASURED_CEILINGS.get(families.pop(), {}) if len(families) == 1 else {}
    return [(key, low, min(high, ceilings.get(key, high))) for key, low, high in PARAMETERS
            if fp8 or "fp8" not in key]


@dataclass(frozen=True)
class Fit:
    """Fitted parameter values (``hw_set``), the comparisons they give on the fitted rows, and the
    local linear model of the log throughput ratios around the fit (for held-out estimates)."""

    hw_set: tuple[str, ...]
    comparisons: tuple[Comparison, ...]
    keys: tuple[str, ...]
    x: np.ndarray
    bounds: tuple[np.ndarray, np.ndarray]
    residuals: np.ndarray  # log(predicted / measured throughput) per fitted row
    jacobian: np.ndarray  # d residuals / d x, rows x parameters


def _log_ratios(values, keys, runs: Sequence[PreparedRun]) -> np.ndarray:
    sets = hw_set_for(values, keys, runs[0].hardware.gpu)
    out = np.empty(len(runs))
    for i, p in enumerate(runs):
        try:
            out[i] = np.log(predict(p, sets).throughput_ratio)
        except StageoptError:
            out[i] = 0.0
    return out


def source_weights(runs: Sequence[PreparedRun]) -> np.ndarray:
    """1/sqrt(rows of its source) per row, so that every source weighs the same in the fit."""
    sources = [p.run.source for p in runs]
    return np.array([1 / np.sqrt(sources.count(s)) for s in sources])


def fit(runs: Sequence[PreparedRun], max_evals: int = 20, start: Sequence[str] = (),
        keys: Sequence[str] | None = None, robust: bool = False) -> Fit:
    """Least squares on log throughput ratios, each source weighted equally, inside the physical ranges.

    ``start`` (``hw_set`` strings of an earlier fit) is the starting point; else the preset's values.
    ``keys`` restricts the fit to those parameters (default: every one the rows' precisions use).
    ``robust``: errors beyond ~5% weigh linearly, not squared (``soft_l1``), so one odd measurement among a
    user's few does not drag the fit (the shipped presets keep the plain squares).
    """
    params = [p for p in fitted_ranges(runs) if keys is None or p[0] in keys]
    if not params:
        raise StageoptError("no parameter left to fit: the FP8 GEMM share needs FP8 rows; choose another")
    keys = [k for k, _, _ in params]
    lo, hi = np.array([p[1] for p in params]), np.array([p[2] for p in params])
    given = dict(item.split("=", 1) for item in start)
    x0 = np.array([float(given[k]) if k in given else _current(runs[0], k) for k in keys])
    x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)
    weights = source_weights(runs)
    res = least_squares(lambda x: _log_ratios(x, keys, runs) * weights, x0, bounds=(lo, hi),
                        max_nfev=max_evals, diff_step=0.02, x_scale=hi - lo,
                        loss="soft_l1" if robust else "linear", f_scale=0.05)
    sets = tuple(hw_set_for(res.x, keys, runs[0].hardware.gpu))
    jacobian = _jacobian(res.x, keys, runs, lo, hi) if robust else res.jac / weights[:, None]
    return Fit(hw_set=sets, comparisons=tuple(predict(p, sets) for p in runs), keys=tuple(keys), x=res.x,
               bounds=(lo, hi), residuals=res.fun / weights, jacobian=jacobian)


def _jacobian(x: np.ndarray, keys: Sequence[str], runs: Sequence[PreparedRun], lo, hi) -> np.ndarray:
    """d log ratio / d parameter by one-sided differences of 2% of each range (least_squares returns the
    robust loss's rescaled Jacobian, not this one)."""
    base = _log_ratios(x, keys, runs)
    out = np.empty((len(runs), len(keys)))
    for j in range(len(keys)):
        step = 0.02 * (hi[j] - lo[j]) * (1 if x[j] + 0.02 * (hi[j] - lo[j]) <= hi[j] else -1)
        moved = x.copy()
        moved[j] += step
        out[:, j] = (_log_ratios(moved, keys, runs) - base) / step
    return out


IDENTIFIED_EFFECT = 0.01  # a parameter whose whole range moves no row by 1% is not pinned down by the rows


def fit_identified(runs: Sequence[PreparedRun], keys: Sequence[str] | None = None,
                   max_evals: int = 20, robust: bool = False) -> tuple[Fit, tuple[str, ...]]:
    """:func:`fit`, then a refit without the parameters the rows do not constrain.

    Why: a parameter no row is sensitive to drifts to wherever the optimizer
    leaves it (often a bound), which reads as a measurement when it is none.
    Such a parameter keeps the hardware file's value. Returns the fit and the
    keys left out. The effect of a parameter is, from the fit's Jacobian, the
    largest change in any row's log throughput across its whole range.
    """
    whole = fit(runs, max_evals, keys=keys, robust=robust)
    lo, hi = whole.bounds
    effect = np.max(np.abs(whole.jacobian), axis=0) * (hi - lo)
    loose = tuple(k for k, e in zip(whole.keys, effect) if e < IDENTIFIED_EFFECT)
    kept = [k for k in whole.keys if k not in loose]
    if not kept:
        raise StageoptError(f"the runs pin down none of {', '.join(whole.keys)} (no run's time moves by "
                            f"{IDENTIFIED_EFFECT:.0%} across their ranges); add runs with more compute per GPU")
    if not loose:
        return whole, ()
    return fit(runs, max_evals, start=whole.hw_set, keys=kept, robust=robust), loose


def hardware_value(run: PreparedRun, key: str) -> float | None:
    """The value of a dotted hardware field (``gpu.efficiency.launch_us``) in a row's hardware; None where unset."""
    obj = run.hardware
    for part in key.split("."):
        obj = getattr(obj, part)
    return float(obj) if obj is not None else None


def _current(run: PreparedRun, key: str) -> float:
    value = hardware_value(run, key)
    return value if value is not None else 0.7


def held_out_errors(whole: Fit, runs: Sequence[PreparedRun]) -> dict[str, np.ndarray]:
    """Per source: throughput errors of its rows under a refit without them (linearized).

    The refit is one bounded Gauss-Newton step from the fit to all rows, with its
    Jacobian: minimize the other sources' weighted log ratios, then move the
    held-out rows' log ratios by the same step. Exact where the model is linear
    in its parameters near the fit; :func:`leave_one_source_out` refits in full.
    """
    sources = np.array([p.run.source for p in runs])
    weights = source_weights(runs)
    lo, hi = whole.bounds
    out = {}
    for source in sorted(set(sources)):
        rest = sources != source
        if not rest.any():
            continue
        w = weights[rest]
        step = lsq_linear(whole.jacobian[rest] * w[:, None], -whole.residuals[rest] * w,
                          bounds=(lo - whole.x - 1e-12, hi - whole.x + 1e-12)).x
        held = ~rest
        out[source] = np.exp(whole.residuals[held] + whole.jacobian[held] @ step) - 1.0
    return out


def information_shares(whole: Fit, runs: Sequence[PreparedRun]) -> dict[str, dict[str, float]]:
    """Per fitted parameter, each source's share of what the rows say about it (the shares sum to 1).

    What a row says about a parameter is its weighted sensitivity squared, the parameter's diagonal of
    the fit's Gauss-Newton information (J^T W^2 J with the fit's source weights). A share near 1 means
    one source alone sets the value: held out, the parameter is left to the other rows' faint
    preferences, and that source's held-out error says more about the fit's freedom than the model.
    """
    weighted = (whole.jacobian * source_weights(runs)[:, None]) ** 2
    sources = np.array([p.run.source for p in runs])
    total = weighted.sum(axis=0)
    return {key: {s: float(weighted[sources == s, j].sum() / total[j]) for s in sorted(set(sources))}
            for j, key in enumerate(whole.keys) if total[j] > 0}


def leave_one_source_out(runs: Sequence[PreparedRun], max_evals: int = 20, start: Sequence[str] = (),
                         keys: Sequence[str] | None = None, robust: bool = False) -> dict[str, tuple[Comparison, ...]]:
    """For each source: the comparisons on its rows from a fit (of ``keys``) to every other source's rows."""
    out = {}
    for source in sorted({p.run.source for p in runs}):
        rest = [p for p in runs if p.run.source != source]
        if not rest:
            continue
        held = [p for p in runs if p.run.source == source]
        sets = fit(rest, max_evals, start, keys, robust).hw_set
        out[source] = tuple(predict(p, sets) for p in held)
    return out
