"""HBM a training job cannot use for its tensors: the per-GPU memory reserve.

Why a reserve: a plan whose tensors need 79.9 of 80 GiB does not run. Every
process first spends memory outside the model's tensors:

- the CUDA context and kernel images (about 0.5 GiB on Hopper with CUDA 12's
  lazy module loading), plus cuBLAS / Transformer Engine workspaces (about 0.5 GiB);
- NCCL communicator buffers, for every TP, CP, EP, PP and DP group a rank joins
  (about 1 GiB; NCCL's NVLS algorithm alone can take more);
- the caching allocator's fragmentation slack, which grows with capacity
  (3% of HBM: an assumption, smaller than without expandable segments).

Default: ``2 GiB + 3% of HBM`` (4.4 GiB on an 80 GiB GPU, 6.3 GiB on 141 GiB).
These are assumptions stated here, not measurements; a hardware file sets its
own with ``gpu.reserve_gib``, a search space with ``cluster.reserve_gib``, the
CLI with ``--reserve-gib``.
"""

from __future__ import annotations

FIXED_RESERVE_GIB = 2.0  # CUDA context + library workspaces (1 GiB) + NCCL buffers (1 GiB)
SLACK_FRACTION = 0.03  # caching-allocator fragmentation, as a fraction of HBM


def default_reserve_gib(hbm_gib: float) -> float:
    """The reserve used when neither the hardware file, the space nor the CLI sets one."""
    return FIXED_RESERVE_GIB + SLACK_FRACTION * hbm_gib


def usable_gib(hbm_gib: float, reserve_gib: float | None) -> float:
    """HBM left for the plan's tensors once the reserve (default when ``None``) is kept free."""
    return hbm_gib - (default_reserve_gib(hbm_gib) if reserve_gib is None else reserve_gib)


def memory_fit(peak_gib: float, hbm_gib: float, reserve_gib: float) -> dict[str, float | bool]:
    """Whether a plan whose tensors peak at ``peak_gib`` fits, and the free memory left per GPU."""
    free = hbm_gib - reserve_gib - peak_gib
    return {"hbm_gib": hbm_gib, "reserve_gib": reserve_gib, "peak_memory_gib": peak_gib, "free_gib": free,
            "fits": free >= 0}


def fit_line(fit: dict, hardware: str) -> str:
    """One line: ``fits h100-sxm: peak 61.2 + reserve 4.4 of 80 GiB, free 14.4 GiB``."""
    verdict = "fits" if fit["fits"] else "DOES NOT FIT"
    tail = f"free {fit['free_gib']:.1f} GiB" if fit["fits"] else f"over by {-fit['free_gib']:.1f} GiB"
    where = f" {hardware}" if hardware else ""
    return (f"{verdict}{where}: peak {fit['peak_memory_gib']:.1f} + reserve {fit['reserve_gib']:.1f} "
            f"of {fit['hbm_gib']:g} GiB, {tail}")
