"""How a model's decoder layers, embedding and loss are split over pipeline model stages.

Why its own module: frameworks do not split layers evenly. Megatron-Core gives
the first and last pipeline rank their own layer counts
(``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``),
can count the embedding and the loss as one layer each when it balances the
split (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``), or takes an explicit layout string
(``--pipeline-model-parallel-layout``, e.g. ``"Et*3|(tt|)*29,m|L"``). Meta split
Llama 3 405B's 126 layers over pp16 with interleaving by giving the first and
last stage one layer less; DeepSeek-V3's 61 layers do not divide by 16 at all.

A *model stage* is one contiguous piece of the model (a virtual pipeline stage):
``pp * vpp`` of them for looped and V-shaped schedules. Where each one runs is
the schedule's business (:mod:`stageopt.parallel.placement`). The rules follow
Megatron-Core's ``TransformerConfig`` checks; where Megatron would reject a
split, :class:`InfeasiblePlan` names the rule and a fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stageopt.errors import InfeasiblePlan

_LAYOUT_CHARS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}


@dataclass(frozen=True, slots=True)
class ModelStage:
    """One model stage: its decoder layers, whether it holds the embedding or the loss (output layer),
    and the multi-token-prediction modules it runs (they sit with the loss)."""

    layers: int
    embedding: bool = False
    loss: bool = False
    mtp: int = 0


def parse_layout(text: str) -> list[str]:
    """Megatron's layout string unrolled to one string per model stage (``'Ettt'``, ``'tt'``, ``'L'``).

    ``(ab|)*n`` repeats a group, ``x*n`` a character, commas are cosmetic,
    ``|`` separates model stages (Megatron-Core's ``parse_str_to_list`` rules).
    """
    flat = text.replace(",", "").replace(" ", "")
    if any(int(n) > 100_000 for n in re.findall(r"\*(\d+)", flat)) or len(flat) > 10_000:
        raise InfeasiblePlan("plan: layout is too long or repeats more than 100,000 times; "
                             "real layouts have at most a few thousand layers")
    try:
        flat = re.sub(r"\(([^()]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
        flat = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    except (ValueError, OverflowError):
        raise InfeasiblePlan(f"plan: layout={text!r} has a repeat count that is not a number") from None
    bad = sorted({c for c in flat if c not in _LAYOUT_CHARS and c != "|"})
    if bad:
        raise InfeasiblePlan(f"plan: layout={text!r} has unknown layer character(s) {''.join(bad)!r}; use E "
                             "(embedding), t (decoder layer), m (MTP module), L (loss) and | between stages")
    return flat.split("|")


def layout_stages(text: str, layers: int, mtp: int = 0) -> list[ModelStage]:
    """Model stages of a layout string, checked as Megatron-Core checks them."""
    stages = parse_layout(text)
    flat = "".join(stages)
    if flat.count("t") != layers:
        raise InfeasiblePlan(f"plan: layout has {flat.count('t')} decoder layers (t) but the model has "
                             f"layers={layers}; make the layout's t count {layers}")
    if flat.count("m") != mtp:
        raise InfeasiblePlan(f"plan: layout has {flat.count('m')} MTP modules (m) but the model has "
                             f"mtp_layers={mtp}; put {mtp} m before the L")
    if any("m" in s and "L" not in s for s in stages):
        raise InfeasiblePlan("plan: layout puts an MTP module (m) in a stage without the loss (L); "
                             "stageopt models MTP on the loss stage, so write ...mL")
    if flat.count("E") != 1 or flat.count("L") != 1:
        raise InfeasiblePlan("plan: layout must name the embedding (E) and the loss (L) exactly once each")
    if not stages[0].startswith("E") or not stages[-1].endswith("L"):
        raise InfeasiblePlan("plan: layout must start with E in the first stage and end with L in the last "
                             f"stage, got first {stages[0]!r} and last {stages[-1]!r}")
    return [ModelStage(layers=s.count("t"), embedding="E" in s, loss="L" in s, mtp=s.count("m")) for s in stages]


def split_layers(layers: int, pp: int, vpp: int, *, first: int = 0, last: int = 0, embed_split: bool = False,
                 loss_split: bool = False, layout: str = "", mtp: int = 0) -> list[ModelStage]:
    """Decoder layers per model stage (``pp * vpp`` of them, model order), embedding first, loss last.

    ``first``/``last`` (0 = unset) are the layers of the first and last pipeline
    *rank*, spread evenly over its ``vpp`` chunks; the middle ranks share the
    rest evenly. ``embed_split``/``loss_split`` count the embedding and the
    loss as one layer each and split the total evenly over all model stages.
    With none of them, layers split evenly; with vpp=1 a remainder goes to the
    middle stages first (stageopt's default; Megatron would need divisibility).
    ``mtp`` multi-token-prediction modules go with the loss (Megatron-Core's default placement).
    """
    n = pp * vpp
    if layout:
        stages = layout_stages(layout, layers, mtp)
        if len(stages) != n:
            raise InfeasiblePlan(f"plan: layout has {len(stages)} stages but pp*vpp = {pp}*{vpp} = {n}; "
                                 f"give {n} '|'-separated stages or set vpp={len(stages) // pp if len(stages) % pp == 0 else '?'}")
        return stages
    if first or last:
        counts = _first_last_counts(layers, pp, vpp, first, last)
    elif embed_split or loss_split:
        counts = _balanced_counts(layers, n, embed_split, loss_split)
    else:
        counts = _even_counts(layers, pp, vpp)
    return [ModelStage(layers=c, embedding=(k == 0), loss=(k == n - 1), mtp=mtp if k == n - 1 else 0)
            for k, c in enumerate(counts)]


def _even_counts(layers: int, pp: int, vpp: int) -> list[int]:
    n = pp * vpp
    if n > layers:
        raise InfeasiblePlan(f"plan: pp*vpp = {n} exceeds layers={layers}; every pipeline chunk needs at least "
                             "one layer (or give a layout with empty stages)")
    if vpp > 1 and layers % n:
        raise InfeasiblePlan(f"plan: pp*vpp = {pp}*{vpp} does not divide layers={layers}; interleaving needs equal "
                             "chunks: pick vpp so that it divides, or set first_layers/last_layers, "
                             "embed_split/loss_split or a layout")
    base, extra = divmod(layers, n)
    counts = [base] * n
    order = sorted(range(n), key=lambda c: (c in (0, n - 1), c))
    for c in order[:extra]:
        counts[c] += 1
    return counts


def _first_last_counts(layers: int, pp: int, vpp: int, first: int, last: int) -> list[int]:
    """Megatron-Core's uneven split: first/last rank counts, the middle ranks share the rest evenly."""
    middle_ranks = pp - (first > 0) - (last > 0)
    rest = layers - first - last
    if middle_ranks < 0 or (pp == 1):
        raise InfeasiblePlan(f"plan: first_layers/last_layers need pp >= {(first > 0) + (last > 0) + 1} "
                             f"(got pp={pp}); drop them or raise pp")
    if rest < 0 or (rest > 0 and middle_ranks == 0) or (middle_ranks and rest % middle_ranks):
        raise InfeasiblePlan(f"plan: layers={layers} minus first_layers={first} and last_layers={last} leaves "
                             f"{rest} for {middle_ranks} middle pipeline ranks; they must divide evenly")
    per_middle = rest // middle_ranks if middle_ranks else 0
    for name, value in (("first_layers", first), ("last_layers", last), ("layers per middle rank", per_middle)):
        if value and value % vpp:
            raise InfeasiblePlan(f"plan: {name}={value} is not divisible by vpp={vpp}; every chunk of a rank "
                                 "holds the same number of layers")
    per_rank = [first or per_middle] + [per_middle] * (pp - 2) + [last or per_middle]
    return [per_rank[k % pp] // vpp for k in range(pp * vpp)]


def _balanced_counts(layers: int, n: int, embed_split: bool, loss_split: bool) -> list[int]:
    """Embedding and loss count as one layer each; all model stages get the same number of slots."""
    slots = layers + embed_split + loss_split
    if slots % n:
        raise InfeasiblePlan(f"plan: layers={layers} plus embedding and loss counted as layers is {slots}, "
                             f"not divisible by pp*vpp = {n}; change pp/vpp or the embed_split/loss_split flags")
    per = slots // n
    counts = [per] * n
    counts[0] -= embed_split
    counts[-1] -= loss_split
    if min(counts) < 0:
        raise InfeasiblePlan(f"plan: {n} model stages of {per} slots leave no room for the embedding or loss; "
                             "lower pp*vpp")
    return counts
