"""Collective algorithm choices and their α-β (latency-bandwidth) costs.

Why here: the analytical model needs a closed form per (collective, algorithm)
on one network tier, and the ASTRA-sim config writer needs the same choice per
network dimension, so both read it from the hardware description.

Conventions, for ``n`` ranks, ``S`` bytes, per-step latency α (the tier's
``latency_us``) and per-GPU one-direction bandwidth β (the tier's
``bandwidth_gbps``, 1 GB = 1e9 bytes):

* ``S`` is the whole buffer: the all-reduce buffer, the all-gather *output*,
  the reduce-scatter *input*, and a rank's whole all-to-all send buffer.
  (ASTRA-sim's trace ``comm_size`` for all-gather is the per-rank input, S/n.)
* ring: all-reduce ``2(n-1)α + 2(n-1)/n·S/β``; all-gather and reduce-scatter
  ``(n-1)α + (n-1)/n·S/β``; all-to-all on a one-direction ring sends the piece
  for distance d over d links, so a link carries ``S/n·Σd = (n-1)/2·S`` bytes:
  ``(n-1)α + (n-1)/2·S/β``.
* tree (NCCL double binary tree, pipelined): all-reduce
  ``2⌈log2 n⌉α + 2(n-1)/n·S/β`` (NCCL's bus-bandwidth convention).
* halving_doubling (recursive halving/doubling, Rabenseifner for all-reduce):
  ``⌈log2 n⌉α`` per phase; volume as for ring.
* direct (every rank sends to every peer at once, bandwidth-limited at the
  sender): all-gather, reduce-scatter, all-to-all ``α + (n-1)/n·S/β``;
  all-reduce = reduce-scatter + all-gather = ``2α + 2(n-1)/n·S/β``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from stageopt.errors import ConfigError

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
Algorithm = Literal["ring", "tree", "halving_doubling", "direct"]

COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

SUPPORTED: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "halving_doubling", "direct"),
    "all_gather": ("ring", "halving_doubling", "direct"),
    "reduce_scatter": ("ring", "halving_doubling", "direct"),
    "all_to_all": ("ring", "direct"),
}

# ASTRA-sim's names for the same algorithms (system config "*-implementation").
ASTRA_SIM_NAMES: dict[str, str] = {
    "ring": "ring",
    "tree": "doubleBinaryTree",
    "halving_doubling": "halvingDoubling",
    "direct": "direct",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveAlgorithms:
    """The algorithm each collective uses on one network tier."""

    all_reduce: Algorithm = "ring"
    all_gather: Algorithm = "ring"
    reduce_scatter: Algorithm = "ring"
    all_to_all: Algorithm = "direct"

    def __post_init__(self) -> None:
        for kind in COLLECTIVE_KINDS:
            algo = getattr(self, kind)
            if algo not in SUPPORTED[kind]:
                raise ConfigError(f"CollectiveAlgorithms.{kind} = {algo!r} is not supported; "
                                  f"choose one of {', '.join(SUPPORTED[kind])}")

    def for_kind(self, kind: CollectiveKind) -> Algorithm:
        """The algorithm chosen for ``kind``."""
        if kind not in COLLECTIVE_KINDS:
            raise ConfigError(f"collective kind {kind!r} unknown; choose one of {', '.join(COLLECTIVE_KINDS)}")
        return getattr(self, kind)  # type: ignore[no-any-return]


def alpha_beta_terms(kind: CollectiveKind, algorithm: Algorithm, n):
    """Return ``(latency_steps, volume_factor)``: time = steps·α + factor·S/β.

    ``n`` may be an int or a numpy array (the analytical model evaluates many
    candidates at once); groups of one rank cost nothing.
    """
    if algorithm not in SUPPORTED.get(kind, ()):
        raise ConfigError(f"collective {kind} has no algorithm {algorithm!r}; "
                          f"choose one of {', '.join(SUPPORTED.get(kind, ()))}")
    n_arr = np.asarray(n, dtype=float)
    many = n_arr > 1
    safe = np.where(many, n_arr, 2.0)
    share = (safe - 1) / safe
    log_steps = np.ceil(np.log2(safe))
    phases = 2.0 if kind == "all_reduce" else 1.0
    if kind == "all_to_all":
        steps, factor = (safe - 1, (safe - 1) / 2) if algorithm == "ring" else (np.ones_like(safe), share)
    else:
        steps = {"ring": safe - 1, "tree": log_steps, "halving_doubling": log_steps,
                 "direct": np.ones_like(safe)}[algorithm] * phases
        factor = phases * share
    steps, factor = np.where(many, steps, 0.0), np.where(many, factor, 0.0)
    if steps.ndim == 0:
        return float(steps), float(factor)
    return steps, factor


def collective_time_s(kind: CollectiveKind, algorithm: Algorithm, size_bytes: float, n: int,
                      bandwidth_gbps: float, latency_us: float) -> float:
    """α-β time in seconds of one collective of ``size_bytes`` over ``n`` ranks of one tier."""
    steps, factor = alpha_beta_terms(kind, algorithm, n)
    return steps * latency_us * 1e-6 + factor * size_bytes / (bandwidth_gbps * 1e9)
