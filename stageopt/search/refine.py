"""Local refinement: propose unevaluated neighbours of the best plans found so far.

Why: plan spaces are rugged and the optimum often differs from a near-optimum in
one or two coupled choices (e.g. interleaving depth once the pipeline is deep
enough). TPE finds the right region quickly but then re-proposes plans it has
already seen; spending those asks on the untried one-step neighbours of the
incumbents (steepest-descent style, best first) finds the optimum far more
often for the same number of simulations. Neighbours are enqueued as ordinary
Optuna trials, so storage, resume and the budget treat them like any other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from stageopt.search.dimensions import Value
from stageopt.search.space import SearchSpace

COUPLED = (("schedule", "vpp"), ("pp", "vpp"), ("tp", "cp"), ("tp", "pp"))


def neighbours(space: SearchSpace, choices: Mapping[str, Value]) -> Iterator[dict[str, Value]]:
    """Choices one move away: one dimension to any other value, or a coupled pair to any pair."""
    dims = {d.name: d for d in space.dims}
    for name, dim in dims.items():
        for value in dim.values:
            if value != choices[name]:
                yield {**choices, name: value}
    for a, b in COUPLED:
        if a in dims and b in dims:
            for va in dims[a].values:
                for vb in dims[b].values:
                    if va != choices[a] and vb != choices[b]:
                        yield {**choices, a: va, b: vb}
