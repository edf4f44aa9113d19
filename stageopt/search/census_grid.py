"""Enumerate the combinations of a space into valid, canonical candidates, linearly and in chunks.

Why not one ``make_candidate`` per combination: a 10^5-combination space would
take ~10 s of Python per-plan checks. The two rules that reject most combinations
(tp*cp*pp must divide the GPU count; the global batch must divide into mbs*dp
micro-batches) are evaluated on numpy arrays of whole chunks first; survivors are
mapped to their canonical form (:func:`stageopt.search.candidate.canonical`) and
only the first combination of each canonical plan is built and validated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from stageopt.errors import StageoptError
from stageopt.search.candidate import Candidate, HardwareCatalog, canonical, make_candidate
from stageopt.search.dimensions import Value
from stageopt.search.space import SearchSpace

CHUNK = 1 << 15
_GPUS_RULE = "tp*cp*pp does not divide gpus"
_BATCH_RULE = "gbs is not divisible by mbs*dp"


@dataclass
class Enumeration:
    """Valid canonical candidates (first combination of each kept as its choices) and what was dropped."""

    cands: list[Candidate] = field(default_factory=list)
    choices: list[dict[str, Value]] = field(default_factory=list)
    invalid_reasons: Counter = field(default_factory=Counter)
    merged: int = 0  # valid combinations that restate an earlier candidate (canonical rules)


def flat_indices(total: int, limit: int, seed: int) -> tuple[np.ndarray | None, int]:
    """All combinations (``None``: 0..total-1) when they fit under ``limit``, else a seeded sample."""
    if total <= limit:
        return None, total
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(total, size=limit, replace=False)), limit


def enumerate_space(space: SearchSpace, catalog: HardwareCatalog, sample: np.ndarray | None, count: int,
                    progress: tqdm | None = None) -> Enumeration:
    """Candidates of the combinations numbered ``sample`` (or all ``count`` of them)."""
    out = Enumeration()
    seen: set[tuple] = set()
    for rows, rejected, size in _chunks(space, sample, count):
        out.invalid_reasons.update(rejected)
        for values in rows:
            _add(space, catalog, values, out, seen)
        if progress is not None:
            progress.update(size)
    return out


def _add(space: SearchSpace, catalog: HardwareCatalog, values: dict[str, Value], out: Enumeration,
         seen: set[tuple]) -> None:
    """Keep the first combination of each canonical plan; count rule violations and merges."""
    framework = space.frameworks[str(values["framework"])]
    model = space.models_by_seq[int(values["seq"])]  # type: ignore[arg-type]
    gpus = int(values["gpus"])  # type: ignore[arg-type]
    fields = canonical(values, gpus, model, framework)
    marker = (catalog.key_for(values), gpus, values["gbs"], values["seq"], values["framework"],
              *fields.values())
    if marker in seen:
        out.merged += 1
        return
    seen.add(marker)
    try:
        cand = make_candidate(space, catalog, values)
    except StageoptError as err:
        out.invalid_reasons[str(err).removeprefix("plan: ").split(";")[0]] += 1
        return
    out.cands.append(cand)
    out.choices.append({d.name: values[d.name] for d in space.dims})


def _chunks(space: SearchSpace, sample: np.ndarray | None,
            count: int) -> Iterator[tuple[list[dict[str, Value]], Counter, int]]:
    """Per chunk: the combinations that pass the two array rules (as dicts of every value, fixed ones
    filled in), the count each rule rejected, and the chunk's size."""
    dims = space.dims
    shape = tuple(len(d.values) for d in dims)
    tables = [np.array(d.values, dtype=object) for d in dims]
    fixed = space.complete({})
    for start in range(0, count, CHUNK):
        flat = np.arange(start, min(start + CHUNK, count)) if sample is None else sample[start:start + CHUNK]
        index = np.unravel_index(flat, shape) if shape else ()
        cols = {d.name: table[i] for d, table, i in zip(dims, tables, index)}
        n = len(flat)
        num = {name: (cols[name].astype(np.int64) if name in cols else np.full(n, int(fixed[name]), dtype=np.int64))
               for name in ("gpus", "tp", "cp", "pp", "gbs", "mbs")}
        model_par = num["tp"] * num["cp"] * num["pp"]
        ok_gpus = num["gpus"] % model_par == 0
        dp = np.where(ok_gpus, num["gpus"] // model_par, 1)
        ok = ok_gpus & (num["gbs"] % (num["mbs"] * dp) == 0)
        rejected = Counter({_GPUS_RULE: int((~ok_gpus).sum()), _BATCH_RULE: int((ok_gpus & ~ok).sum())})
        names = list(cols)
        kept = [cols[name][ok].tolist() for name in names]
        if not names:
            yield [dict(fixed)] * int(ok.sum()), +rejected, n
            continue
        rows = [{**fixed, **dict(zip(names, combo))} for combo in zip(*kept)]
        yield rows, +rejected, n
