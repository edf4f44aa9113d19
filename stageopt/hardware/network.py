"""Collective and point-to-point times over the hardware's network tiers (vectorized).

A communicator group whose consecutive members are ``stride`` ranks apart
keeps ``n_in = min(n, node_gpus // stride)`` members inside one NVLink domain
(ranks are laid out TP innermost, so small strides stay inside a node).
Groups that span nodes run hierarchically: all-reduce as intra-node
reduce-scatter, inter-node all-reduce of 1/n_in of the buffer, intra-node
all-gather; all-gather and reduce-scatter as one intra- and one inter-node
phase; all-to-all sends the share of each rank's buffer bound for other nodes
over the scale-out tier. Each tier uses its own algorithm and α-β cost
(:mod:`stageopt.hardware.collectives`).
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware.collectives import alpha_beta_terms
from stageopt.hardware.machine import Hardware, Tier


def _tier_time(tier: Tier, kind: str, size, n):
    steps, factor = alpha_beta_terms(kind, tier.collectives.for_kind(kind), n)
    return steps * tier.latency_us * 1e-6 + factor * size / (tier.bandwidth_gbps * 1e9)


def ranks_inside_node(hw: Hardware, n, stride):
    n = np.asarray(n, dtype=float)
    per_node = np.maximum(np.floor(hw.node.gpus / np.asarray(stride, dtype=float)), 1.0)
    return np.minimum(n, per_node)


def collective_time(hw: Hardware, kind: str, size, n, stride):
    """Seconds for one collective; ``size`` is the whole buffer (AG output, RS input)."""
    size = np.asarray(size, dtype=float)
    n = np.asarray(n, dtype=float)
    inner, outer = hw.tiers[0], hw.tiers[1]
    n_in = ranks_inside_node(hw, n, stride)
    n_out = np.maximum(np.ceil(n / n_in), 1.0)
    if kind == "all_to_all":
        intra = _tier_time(inner, kind, size * n_in / n, n_in)
        off_node = (n - n_in) / n * size
        inter = np.where(n_out > 1, outer.latency_us * 1e-6 + off_node / (outer.bandwidth_gbps * 1e9), 0.0)
        return intra + inter
    if kind == "all_reduce":
        flat = _tier_time(inner, kind, size, n_in)
        hier = (_tier_time(inner, "reduce_scatter", size, n_in) + _tier_time(outer, kind, size / n_in, n_out)
                + _tier_time(inner, "all_gather", size, n_in))
        return np.where(n_out > 1, hier, flat)
    return _tier_time(inner, kind, size, n_in) + _tier_time(outer, kind, size / n_in, n_out)


def p2p_time(hw: Hardware, size, stride):
    """One send between neighbouring pipeline stages, ``stride`` ranks apart."""
    crosses = np.asarray(stride, dtype=float) >= hw.node.gpus
    inner, outer = hw.tiers[0], hw.tiers[1]
    t_in = inner.latency_us * 1e-6 + np.asarray(size, dtype=float) / (inner.bandwidth_gbps * 1e9)
    t_out = outer.latency_us * 1e-6 + np.asarray(size, dtype=float) / (outer.bandwidth_gbps * 1e9)
    return np.where(crosses, t_out, t_in)


def flat_scaleout_time(hw: Hardware, kind: str, size, n):
    """A collective run as one flat ring bound by each GPU's scale-out NIC.

    How ZeRO-3's per-layer gathers and scatters behaved at 384-2,240 A100s in
    Narayanan et al. 2021, Table 2 (see experiments/validation): used for them
    by both the analytical model and the replay.
    """
    return _tier_time(hw.tiers[1], kind, size, n)
