"""Known plans a search starts from: ``--seed-plan`` text, and (multi-fidelity) the census's best plans.

Why apart from the session: a seed plan is checked against the space as strictly
as a sampled one (every searched field must be one of the space's values, a fixed
field must not contradict the space), and the same check serves the sampled loop
(enqueued trials) and census-guided confirmation (simulated first).
"""

from __future__ import annotations

from typing import Any

import optuna

from stageopt.errors import ConfigError
from stageopt.parallel.plan import Plan, parse_plan_fields
from stageopt.search.candidate import Candidate, HardwareCatalog, make_candidate
from stageopt.search.census import Census
from stageopt.search.dimensions import Value
from stageopt.search.objective import Objective
from stageopt.search.space import SearchSpace, encode_choices


def seed_params(space: SearchSpace, catalog: HardwareCatalog, text: str) -> dict[str, Any]:
    """Parameters of a known-good plan given as text (``--seed-plan``); hardware dims take their first value,
    and a searched field the text leaves out takes the value the plan resolves to (its framework's default)."""
    given = parse_plan_fields(text)
    plan = Plan.parse(text, gpus=space.gpus[0] if "dp=" not in text else None)
    choices: dict[str, Any] = {"gpus": plan.gpus}
    for d in space.hw_dims:
        choices[d.name] = d.values[0]
    for d in space.plan_dims:
        if d.name in ("seq", "framework"):
            choices[d.name] = given.get(d.name, d.values[0])
        else:
            choices[d.name] = getattr(plan, d.name)
    for name, value in space.fixed_plan.items():
        if name in given and value is not None and given[name] != value and not (name == "sp" and plan.tp == 1):
            raise ConfigError(f"--seed-plan {text!r}: {name}={given[name]} but the space fixes {name}={value}")
    if plan.gbs != space.gbs and "gbs" in given and "gbs" not in {d.name for d in space.plan_dims}:
        raise ConfigError(f"--seed-plan {text!r}: gbs={plan.gbs} but the space trains with global_batch={space.gbs}")
    try:
        params = encode_choices(space, choices)
    except ConfigError as err:
        raise ConfigError(f"--seed-plan {text!r}: {err}") from None
    if len(space.gpus) == 1 and plan.gpus != space.gpus[0]:
        raise ConfigError(f"--seed-plan {text!r}: uses {plan.gpus} GPUs, the space has {space.gpus[0]}")
    make_candidate(space, catalog, space.complete({d.name: choices[d.name] for d in space.dims}))
    return params


def seed_candidate(space: SearchSpace, catalog: HardwareCatalog, text: str) -> tuple[dict[str, Value], Candidate]:
    """The choices and candidate of a ``--seed-plan`` (checked as :func:`seed_params` does)."""
    params = seed_params(space, catalog, text)
    choices = {d.name: d.decode(params) for d in space.dims}
    return choices, make_candidate(space, catalog, space.complete(choices))


def enqueue_known(study: optuna.Study, seed_plans: tuple[str, ...], space: SearchSpace, catalog: HardwareCatalog,
                  screened: Census | None, objectives: tuple[Objective, ...], top: int) -> None:
    """Queue ``--seed-plan`` plans, then (multi-fidelity) the ``top`` analytically best plans of the space."""
    for text in seed_plans:
        study.enqueue_trial(seed_params(space, catalog, text), skip_if_exists=True)
    if screened is not None:
        for outcome in screened.ranked(objectives)[:top]:
            study.enqueue_trial(encode_choices(space, screened.choices_of(outcome.key)), skip_if_exists=True)
