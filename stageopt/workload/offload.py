"""Activation offloading (Megatron-Core's ``--cpu-offloading-num-layers``): what leaves HBM, what it costs.

Transformer Engine's offload handler copies the saved tensors of the first
``n`` decoder layers to host memory after each layer's forward: the copy of
layer i runs while layer i+1 computes, and layer i+2 waits for it. In backward
it copies them back one layer ahead: the reload of layer i-1 runs while layer
i's backward computes. So HBM holds the other layers' activations plus the one
offloaded layer in flight, and each copy costs only what its neighbour's
compute does not hide. The neighbour is priced as a layer of the same kind
(exact for uniform stacks; the layer after the last offloaded one may differ).
Plans arrive as arrays (the analytical batch); one plan is an array of one.
"""

from __future__ import annotations

import numpy as np

from stageopt.model.layer_types import layer_kinds


def offloaded_layer_counts(model, n_layers) -> dict[str, np.ndarray]:
    """Per decoder-layer kind, how many of the first ``n_layers`` are of that kind (those are offloaded)."""
    kinds = layer_kinds(model)
    n = np.asarray(n_layers, dtype=int)
    out = {}
    for kind in dict.fromkeys(kinds):
        cumulative = np.concatenate([[0], np.cumsum([k == kind for k in kinds])])
        out[kind] = cumulative[np.clip(n, 0, len(kinds))].astype(float)
    return out


def offloaded_bytes(counts: dict[str, np.ndarray], saved: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a micro-batch offloads, bytes of the largest offloaded layer: the one in flight) per plan.

    ``saved`` is each layer kind's saved bytes per micro-batch.
    """
    total = sum(counts[k] * saved[k] for k in counts)
    in_flight = np.maximum.reduce([np.where(counts[k] > 0, saved[k], 0.0) for k in counts] + [np.zeros_like(total)])
    return total, in_flight


def exposed_copy_seconds(gpu, counts: dict[str, np.ndarray], saved: dict[str, np.ndarray],
                         fwd: dict[str, np.ndarray], bwd: dict[str, np.ndarray]) -> np.ndarray:
    """Seconds per micro-batch the offload and reload copies add beyond the compute that hides them."""
    total = 0.0
    for kind, count in counts.items():
        if not np.any(count):
            continue
        copy = gpu.host_copy_seconds(saved[kind])
        total = total + count * (np.maximum(0.0, copy - fwd[kind]) + np.maximum(0.0, copy - bwd[kind]))
    return np.asarray(total, dtype=float)
