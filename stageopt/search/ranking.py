"""Order plans best first: objectives, then (ties) lower memory, then the simpler plan.

Why ties need rules: different plans often have the same time (GPipe and 1F1B
with the same bubble, ZeRO-1 and ZeRO-2 when the reduction is hidden); the
first one found is an accident of enumeration order. A tie (objectives equal to
nine significant digits) goes to the plan with the lower peak memory (more
headroom), then to the simpler plan: fewer model-parallel ranks
(tp*cp*pp*ep), then lower vpp, lower ZeRO stage, less recompute, 1F1B before
other schedules, an even pipeline split before an uneven one, then the plan text (so the order is total and reproducible).

Everything here is vectorized: the census orders 10^5 plans at once.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
SCHEDULE_ORDER = {"1f1b": 0, "interleaved": 1, "gpipe": 2, "zbh1": 3, "zbv": 4, "dualpipe": 5, "dualpipev": 6,
                  "zb2p": 7}
SPLIT_FIELDS = ("first_layers", "last_layers", "embed_split", "loss_split")
SIGNIFICANT = 1e9  # objectives equal to ~9 significant digits are a tie


def quantize(values: np.ndarray) -> np.ndarray:
    """Each column rounded relative to its smallest magnitude, so near-equal floats compare equal."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return v
    scale = np.maximum(np.min(np.abs(v), axis=0), 1e-300)
    return np.rint(v / scale * SIGNIFICANT)


def simplicity_columns(plans: Iterable[dict]) -> list[np.ndarray]:
    """Tie-break columns (smaller is simpler), most important first, from plan fields."""
    rows = [(p["tp"] * p["cp"] * p["pp"] * p["ep"], p["vpp"], p["zero"], RECOMPUTE_ORDER.get(p["recompute"], 3),
             SCHEDULE_ORDER.get(p["schedule"], len(SCHEDULE_ORDER)), int(bool(p.get("uneven"))), p["mbs"])
            for p in plans]
    table = np.array(rows, dtype=float).reshape(len(rows), 7)
    return [table[:, j] for j in range(table.shape[1])]


def plan_fields_of_text(text: str) -> dict:
    """The fields ``simplicity_columns`` needs, read from a plan's string form."""
    items = dict(item.split("=", 1) for item in text.split() if "=" in item)
    out = {k: int(items.get(k, 1)) for k in ("tp", "cp", "pp", "ep", "vpp", "mbs")}
    out.update(zero=int(items.get("zero", 0)), recompute=items.get("recompute", "none"),
               schedule=items.get("schedule", "1f1b"),
               uneven=any(items.get(k, "0") not in ("0", "off") for k in SPLIT_FIELDS) or "layout" in items)
    return out


def non_dominated(values: np.ndarray) -> np.ndarray:
    """Boolean mask of the Pareto front (all columns minimized), by one sorted sweep."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    mask = np.zeros(n, dtype=bool)
    if n == 0:
        return mask
    if v.shape[1] == 1:
        return v[:, 0] == v[:, 0].min()
    order = np.lexsort(v.T[::-1])  # by the first column, then the next ...
    front: list[int] = []
    for i in order:
        if front:
            f = v[front]
            if np.any(np.all(f <= v[i], axis=1) & np.any(f < v[i], axis=1)):
                continue
            if np.any(np.all(f == v[i], axis=1)):
                mask[i] = True  # equal to a front point: on the front too
                continue
        front.append(int(i))
        mask[i] = True
    return mask


def pareto_ranks(values: np.ndarray) -> np.ndarray:
    """Non-domination rank (0 = Pareto front) of each row, all columns minimized."""
    v = np.asarray(values, dtype=float)
    ranks = np.full(len(v), -1)
    remaining = np.arange(len(v))
    rank = 0
    while remaining.size:
        front = non_dominated(v[remaining])
        ranks[remaining[front]] = rank
        remaining = remaining[~front]
        rank += 1
    return ranks


def preferred_order(values: np.ndarray, memory: np.ndarray, simple: list[np.ndarray], texts: list[str],
                    front_first: bool = True) -> np.ndarray:
    """Row indices best first: Pareto front first (several objectives), then the first objective,
    then lower memory, then simpler plan, then plan text."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return np.zeros(0, dtype=int)
    q = quantize(v)
    text_rank = np.argsort(np.argsort(np.array(texts, dtype=object)))
    keys = [text_rank, *simple[::-1], np.asarray(memory, dtype=float), *[q[:, j] for j in range(q.shape[1])][::-1]]
    if front_first and v.shape[1] > 1:
        keys.append(~non_dominated(v))
    return np.lexsort(keys)


def first_of_equals(values: np.ndarray) -> np.ndarray:
    """Mask keeping the first row of each group of rows with equal (quantized) values: on a front already in
    preferred order, a plan that only ties a better-placed one (same objectives, more memory) is dropped."""
    q = quantize(values)
    seen: set[tuple] = set()
    keep = np.zeros(len(q), dtype=bool)
    for i, row in enumerate(map(tuple, q)):
        if row not in seen:
            seen.add(row)
            keep[i] = True
    return keep
