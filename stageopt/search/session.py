"""Open (or resume) a study and wire the search: space, storage, sampler, cache, seeds, executor.

Why apart from the CLI: scripts and experiments run searches too; they build a
:class:`SearchOptions` and call :func:`run_search`, and get the same storage,
resume and caching rules as ``stageopt search``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from stageopt.errors import ConfigError
from stageopt.inputs.schema import load_yaml_mapping
from stageopt.parallel.plan import Plan, parse_plan_fields
from stageopt.search.backends import make_simulator
from stageopt.search.cache import ResultCache
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.census import Census, require_feasible, take_census
from stageopt.search.confirm import Confirmation, ConfirmConfig
from stageopt.search.driver import LoopConfig, LoopStats, SearchLoop
from stageopt.search.exact import exact_search
from stageopt.search.executors import RayExecutor
from stageopt.search.objective import Objective, objectives_for
from stageopt.search.outer import outer_search
from stageopt.search.samplers import make_sampler
from stageopt.search.space import SearchSpace, check_objectives, encode_choices, resolve_space_path, space_from_dict
from stageopt.search.storage import (
    CrashSafeJournal,
    check_study_name,
    fail_running,
    make_storage,
    study_exists,
)
from stageopt.search.strategy import Answer, census_answer, pick_mode, sampled_answer

META_ATTR = "stageopt"


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    space: str | None = None
    budget: int = 500
    sampler: str = "tpe"
    objectives: tuple[str, ...] | None = None
    backend: str | None = None
    screen: str | None = None
    screen_top: int | None = None
    workers: int | None = None
    ray_address: str | None = None
    timeout_s: float = 600.0
    astra_sim: str | None = None
    storage: str | None = None
    study_name: str | None = None
    runs_dir: str = "runs"
    resume: bool = False
    seed_plans: tuple[str, ...] = ()
    seed: int | None = None
    max_asks: int | None = None
    batch: int = 8
    reserve_gib: float | None = None  # HBM kept free per GPU (default: the space's, else the hardware's)
    framework: str | None = None  # overrides the space's framework profile(s)
    top: int = 10  # plans an exact census records and prints
    progress: bool = False  # census and simulation progress on stderr


@dataclass
class SearchResult:
    study: optuna.Study
    space: SearchSpace
    objectives: tuple[Objective, ...]
    backend: str
    run_dir: Path
    stats: LoopStats
    answer: Answer
    census: Census | None
    meta: dict[str, Any] = field(default_factory=dict)
    failed_on_resume: int = 0

    @property
    def loop(self) -> SearchLoop | None:
        return self.answer.loop


def run_search(opts: SearchOptions, progress: Callable[[SearchLoop], None] | None = None) -> SearchResult:
    """Open or resume the study, then search until the budget, the ask cap or the space is used up."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _check_options(opts)
    runs_dir = Path(opts.runs_dir)
    data, source = _space_data(opts)
    space = space_from_dict(data, where=source)
    name = check_study_name(opts.study_name) if opts.study_name else _fresh_name(space.name, runs_dir)
    run_dir = runs_dir / name
    storage, journal = make_storage(opts.storage, run_dir)
    exists = study_exists(storage, name)
    if opts.resume and not exists:
        raise ConfigError(f"--resume: no study {name!r} in {opts.storage or run_dir}; check --study-name/--storage")
    if exists and not opts.resume:
        raise ConfigError(f"study {name!r} already exists in {opts.storage or run_dir}; add --resume to continue "
                          "it or choose another --study-name")
    meta = _meta(storage, name) if exists else {}
    if meta:
        space = space_from_dict(meta["space"], where=meta["space_source"])
        if opts.space and _space_data(opts)[0] != meta["space"]:
            raise ConfigError(f"--resume: --space {opts.space} differs from the space study {name!r} was started "
                              "with; drop --space to continue with the stored one")
    names = tuple(meta.get("objectives") or opts.objectives or space.objectives)
    check_objectives(names, "--objectives")
    if meta and opts.objectives and tuple(opts.objectives) != names:
        raise ConfigError(f"--resume: study {name!r} optimizes {','.join(names)}; drop --objectives")
    objectives = objectives_for(names)
    backend = meta.get("backend") or opts.backend or space.backend
    simulator = make_simulator(backend, astra_sim=opts.astra_sim, timeout_s=opts.timeout_s)
    screen = opts.screen or (space.screen if simulator is not None else None)
    if screen and simulator is None:
        raise ConfigError("--screen analytical needs an expensive backend (--backend replay or astra-sim)")
    catalog = HardwareCatalog(space, reserve_gib=opts.reserve_gib)
    mode = pick_mode(opts.sampler, simulator is not None, space)
    census = None
    if mode != "outer":
        census = take_census(space, catalog, seed=opts.seed or 0, progress=opts.progress)
        require_feasible(census, space)
    sampler = make_sampler(opts.sampler, opts.seed, len(objectives))
    study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, load_if_exists=exists,
                                directions=[o.direction for o in objectives])
    if not exists:
        meta = {"space": data, "space_source": source, "objectives": list(names), "backend": backend,
                "sampler": opts.sampler, "mode": mode, "seed": opts.seed, "reserve_gib": opts.reserve_gib,
                "created": time.strftime("%Y-%m-%d %H:%M:%S"), "census": census_summary(census)}
        study.set_user_attr(META_ATTR, meta)
    failed = fail_running(study, storage) if exists else 0
    cache = ResultCache.from_trials(study.get_trials(deepcopy=False))
    workers = opts.workers or (os.cpu_count() or 1)
    executor = (RayExecutor(simulator, space.model, workers=workers, address=opts.ray_address,
                            timeout_s=opts.timeout_s) if simulator is not None else None)
    sync = journal.sync if journal is not None else (lambda: None)
    answer = _answer(mode, opts, study, space, objectives, catalog, cache, census, executor, backend, sync,
                     journal, progress, screen=bool(screen) and not exists)
    return SearchResult(study=study, space=space, objectives=objectives, backend=backend, run_dir=run_dir,
                        stats=answer.stats, answer=answer, census=census, meta=meta, failed_on_resume=failed)


def _check_options(opts: SearchOptions) -> None:
    if opts.budget < 1:
        raise ConfigError(f"--budget {opts.budget}: must be at least 1 (unique simulations)")
    if opts.workers is not None and opts.workers < 1:
        raise ConfigError(f"--workers {opts.workers}: must be at least 1")
    if opts.reserve_gib is not None and opts.reserve_gib < 0:
        raise ConfigError(f"--reserve-gib {opts.reserve_gib:g}: must be >= 0 (GiB kept free per GPU)")
    if opts.top < 1:
        raise ConfigError(f"--top {opts.top}: must be at least 1")


def _answer(mode: str, opts: SearchOptions, study: optuna.Study, space: SearchSpace,
            objectives: tuple[Objective, ...], catalog: HardwareCatalog, cache: ResultCache, census: Census | None,
            executor: RayExecutor | None, backend: str, sync: Callable[[], None], journal: CrashSafeJournal | None,
            progress: Callable[[SearchLoop], None] | None, screen: bool) -> Answer:
    """Run the mode :func:`~stageopt.search.strategy.pick_mode` chose."""
    if mode == "outer":
        return outer_search(study=study, space=space, objectives=objectives, catalog=catalog, cache=cache,
                            executor=executor, budget=opts.budget, backend=backend, sync=sync)
    assert census is not None
    if mode == "exact":
        exact = exact_search(study, space, census, objectives, cache, opts.top)
        sync()
        stats = LoopStats(told=exact.recorded, stop_reason="exact census")
        return census_answer(mode, stats, cache, census, objectives, backend, [exact.line])
    if mode == "confirm":
        assert executor is not None
        seeds = [_seed_candidate(space, catalog, text) for text in opts.seed_plans]
        conf = Confirmation(study=study, space=space, census=census, objectives=objectives, catalog=catalog,
                            cache=cache, executor=executor,
                            config=ConfirmConfig(budget=opts.budget, backend=backend, seed=opts.seed or 0,
                                                 use_model=opts.sampler == "auto", progress=opts.progress),
                            sync=sync)
        return census_answer(mode, conf.run(seeds), cache, census, objectives, backend, [])
    _enqueue_known(study, opts, space, catalog, census if screen else None, objectives)
    config = LoopConfig(budget=opts.budget, max_asks=opts.max_asks or 20 * opts.budget + len(study.trials),
                        batch=opts.batch, backend=backend, refine=opts.sampler in ("tpe", "auto"))
    loop = SearchLoop(study=study, space=space, objectives=objectives, catalog=catalog, cache=cache,
                      census=census, config=config, executor=executor, journal=journal,
                      synchronous=opts.seed is not None or executor is None, progress=progress)
    return sampled_answer(loop, census, objectives, backend)


def census_summary(census: Census | None) -> dict[str, Any] | None:
    """What the study keeps about the census: its size, completeness and what was merged or dropped."""
    if census is None:
        return None
    return {"combinations": census.combos, "exhaustive": census.exhaustive, "valid_plans": len(census),
            "feasible_plans": census.n_feasible, "merged_by_canonical_rules": census.merged,
            "invalid_by_rule": dict(census.invalid_reasons.most_common(10))}


def _seed_candidate(space: SearchSpace, catalog: HardwareCatalog, text: str) -> tuple[dict, Any]:
    """The choices and candidate of a ``--seed-plan`` (checked as ``seed_params`` does)."""
    params = seed_params(space, catalog, text)
    choices = {d.name: d.decode(params) for d in space.dims}
    return choices, make_candidate(space, catalog, space.complete(choices))


def _enqueue_known(study: optuna.Study, opts: SearchOptions, space: SearchSpace, catalog: HardwareCatalog,
                   screened: Census | None, objectives: tuple[Objective, ...]) -> None:
    """Queue ``--seed-plan`` plans, then (multi-fidelity) the analytically best plans of the space."""
    for text in opts.seed_plans:
        study.enqueue_trial(seed_params(space, catalog, text), skip_if_exists=True)
    if screened is not None:
        top = opts.screen_top if opts.screen_top is not None else max(1, opts.budget // 2)
        for outcome in screened.ranked(objectives)[:top]:
            study.enqueue_trial(encode_choices(space, screened.choices_of(outcome.key)), skip_if_exists=True)


def _space_data(opts: SearchOptions) -> tuple[dict[str, Any], str]:
    path = resolve_space_path(opts.space)
    data = dict(load_yaml_mapping(path))
    if opts.framework:
        data["framework"] = opts.framework
    return data, str(path)


def _meta(storage: optuna.storages.BaseStorage, name: str) -> dict[str, Any]:
    study_id = storage.get_study_id_from_name(name)
    meta = storage.get_study_user_attrs(study_id).get(META_ATTR)
    if not isinstance(meta, dict) or "space" not in meta:
        raise ConfigError(f"study {name!r} was not created by 'stageopt search' (no stored space); "
                          "use another --study-name")
    return meta


def _fresh_name(space_name: str, runs_dir: Path) -> str:
    base = f"{space_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    name, n = base, 1
    while (runs_dir / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


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
