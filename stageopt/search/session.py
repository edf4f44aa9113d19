"""Open (or resume) a study and wire the search: space, storage, sampler, cache, seeds, executor.

Why apart from the CLI: scripts and experiments run searches too; they build a
:class:`SearchOptions` and call :func:`run_search`, and get the same storage,
resume and caching rules as ``stageopt search``.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from stageopt.errors import ConfigError
from stageopt.inputs.schema import load_yaml_mapping
from stageopt.parallel.plan import Plan
from stageopt.search.backends import make_simulator
from stageopt.search.cache import StudyCache
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.census import Census, require_feasible, take_census
from stageopt.search.driver import LoopConfig, LoopStats, SearchLoop
from stageopt.search.executors import RayExecutor
from stageopt.search.objective import Objective, objectives_for
from stageopt.search.samplers import make_sampler
from stageopt.search.space import SearchSpace, check_objectives, encode_choices, resolve_space_path, space_from_dict
from stageopt.search.storage import StudyStorage, check_study_name, open_storage, study_exists
from stageopt.search.workers import HEARTBEAT_INTERVAL_S, HeartbeatKeeper

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
    join: bool = False  # create the study, or join it if another worker already did
    seed_plans: tuple[str, ...] = ()
    seed: int | None = None
    max_asks: int | None = None
    batch: int = 8


@dataclass
class SearchResult:
    study: optuna.Study
    space: SearchSpace
    objectives: tuple[Objective, ...]
    backend: str
    run_dir: Path
    stats: LoopStats
    loop: SearchLoop
    census: Census | None
    meta: dict[str, Any] = field(default_factory=dict)
    storage: StudyStorage | None = None


@dataclass
class _Setup:
    """What a search works on: the study's name, storage and (stored or new) space, objectives and backend."""

    name: str
    run_dir: Path
    store: StudyStorage
    exists: bool
    meta: dict[str, Any]
    space: SearchSpace
    names: tuple[str, ...]
    backend: str
    new_meta: dict[str, Any]


def _setup(opts: SearchOptions) -> _Setup:
    data, source = _space_data(opts)
    space = space_from_dict(data, where=source)
    name = check_study_name(opts.study_name) if opts.study_name else _fresh_name(space.name, Path(opts.runs_dir))
    run_dir = Path(opts.runs_dir) / name
    store = open_storage(opts.storage, run_dir)
    exists = study_exists(store.storage, name)
    where = opts.storage or run_dir
    if opts.resume and not exists:
        raise ConfigError(f"--resume: no study {name!r} in {where}; check --study-name/--storage "
                          "(or --join to create it if absent)")
    if exists and not (opts.resume or opts.join):
        raise ConfigError(f"study {name!r} already exists in {where}; add --resume to continue it (--join to "
                          "work on it beside other workers) or choose another --study-name")
    meta = _meta(store.storage, name, wait_s=10.0 if opts.join else 0.0) if exists else {}
    if meta:
        space, names, backend = _stored_setup(opts, meta, name, data)
    else:
        names, backend = tuple(opts.objectives or space.objectives), opts.backend or space.backend
    check_objectives(names, "--objectives")
    new_meta = {"space": data, "space_source": source, "objectives": list(names), "backend": backend,
                "sampler": opts.sampler, "seed": opts.seed}
    return _Setup(name, run_dir, store, exists, meta, space, names, backend, new_meta)


def run_search(opts: SearchOptions, progress: Callable[[SearchLoop], None] | None = None) -> SearchResult:
    """Open, resume or join the study, then search until the budget, the ask cap or the space is used up."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_options(opts)
    setup = _setup(opts)
    space, backend, store = setup.space, setup.backend, setup.store
    objectives = objectives_for(setup.names)
    simulator = make_simulator(backend, astra_sim=opts.astra_sim, timeout_s=opts.timeout_s)
    screen = opts.screen or (space.screen if simulator is not None else None)
    if screen and simulator is None:
        raise ConfigError("--screen analytical needs an expensive backend (--backend replay or astra-sim)")
    catalog = HardwareCatalog(space)
    census = take_census(space, catalog, seed=opts.seed or 0)
    require_feasible(census, space)
    sampler = make_sampler(opts.sampler, space, opts.seed, len(objectives))
    address = _ray_address(opts)
    workers = opts.workers or (None if address else os.cpu_count() or 1)
    executor = (RayExecutor(simulator, space.model, workers=workers, address=address, timeout_s=opts.timeout_s)
                if simulator is not None else None)  # before the study: a bad Ray address writes nothing
    try:
        study, meta, created = _prepare_study(store, setup.name, sampler, objectives, setup.exists, opts,
                                              setup.meta, setup.new_meta)
        cache = StudyCache(study, store.claim_lock)
        _enqueue_known(study, opts, space, catalog, census if screen and created else None, objectives)
    except BaseException:
        if executor is not None:
            executor.close()
        raise
    max_asks = opts.max_asks if opts.max_asks is not None else 20 * opts.budget + len(study.trials)
    config = LoopConfig(budget=opts.budget, max_asks=max_asks, batch=opts.batch, backend=backend,
                        refine=opts.sampler == "tpe")
    with HeartbeatKeeper(store.storage, HEARTBEAT_INTERVAL_S) as heartbeat:
        loop = SearchLoop(study=study, space=space, objectives=objectives, catalog=catalog, cache=cache,
                          census=census, config=config, executor=executor, sync=store.sync, heartbeat=heartbeat,
                          synchronous=opts.seed is not None or executor is None, progress=progress)
        with warnings.catch_warnings():  # Optuna's note that heartbeats are meant for Study.optimize
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            stats = loop.run()
    return SearchResult(study=study, space=space, objectives=objectives, backend=backend, run_dir=setup.run_dir,
                        stats=stats, loop=loop, census=census, meta=meta, storage=store)


def check_options(opts: SearchOptions) -> None:
    """One-line errors for numbers that cannot describe a search (before anything is written)."""
    if opts.budget < 1:
        raise ConfigError(f"--budget {opts.budget}: must be at least 1 (unique simulations)")
    if opts.workers is not None and opts.workers < 1:
        raise ConfigError(f"--workers {opts.workers}: must be at least 1")
    if opts.batch < 1:
        raise ConfigError(f"--batch {opts.batch}: must be at least 1 (candidates asked at once)")
    if opts.max_asks is not None and opts.max_asks < 1:
        raise ConfigError(f"--max-asks {opts.max_asks}: must be at least 1 (or leave it out: 20 x budget)")
    if not math.isfinite(opts.timeout_s) or opts.timeout_s <= 0:
        raise ConfigError(f"--timeout {opts.timeout_s}: must be a positive number of seconds per simulation")
    if opts.resume and opts.join:
        raise ConfigError("--resume and --join: give one (--join also creates the study when it is absent)")
    if opts.sampler == "gp":
        try:
            import torch  # noqa: F401  (Optuna's GPSampler needs it)
        except ImportError:
            raise ConfigError("--sampler gp needs PyTorch: pip install 'stageopt[gp]' (or use --sampler tpe)") from None


def _ray_address(opts: SearchOptions) -> str | None:
    """``--ray-address``, else ``RAY_ADDRESS`` (what ``ray job submit`` sets), else a local Ray of our own."""
    return opts.ray_address or os.environ.get("RAY_ADDRESS") or None


def _stored_setup(opts: SearchOptions, meta: dict[str, Any], name: str,
                  data: dict[str, Any]) -> tuple[SearchSpace, tuple[str, ...], str]:
    """Space, objectives and backend of an existing study; a conflicting flag is an error, not a silent switch."""
    space = space_from_dict(meta["space"], where=meta["space_source"])
    if opts.space and data != meta["space"]:
        raise ConfigError(f"--resume: --space {opts.space} differs from the space study {name!r} was started "
                          "with; drop --space to continue with the stored one")
    names = tuple(meta["objectives"])
    if opts.objectives and tuple(opts.objectives) != names:
        raise ConfigError(f"--resume: study {name!r} optimizes {','.join(names)}; drop --objectives")
    return space, names, meta["backend"]


def _prepare_study(store: StudyStorage, name: str, sampler: optuna.samplers.BaseSampler,
                   objectives: tuple[Objective, ...], exists: bool, opts: SearchOptions, meta: dict[str, Any],
                   new_meta: dict[str, Any]) -> tuple[optuna.Study, dict[str, Any], bool]:
    """Open the study; a new one gets its setup and objective names; then fail dead workers' trials."""
    study, created = _open_study(store, name, sampler, objectives, exists, opts)
    if created:
        meta = {**new_meta, "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        study.set_user_attr(META_ATTR, meta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([o.label for o in objectives])
    elif not exists:  # lost the race to create it: join only what was asked for
        meta = _meta(store.storage, name, wait_s=10.0)
        _stored_setup(opts, meta, name, new_meta["space"])
    _fail_stale(study)
    return study, meta, created


def _open_study(store: StudyStorage, name: str, sampler: optuna.samplers.BaseSampler,
                objectives: tuple[Objective, ...], exists: bool, opts: SearchOptions) -> tuple[optuna.Study, bool]:
    """Create the study, or load it; two workers creating one name at once: the loser joins or is told why."""
    directions = [o.direction for o in objectives]
    if not exists:
        try:
            return optuna.create_study(storage=store.storage, study_name=name, sampler=sampler,
                                       directions=directions), True
        except optuna.exceptions.DuplicatedStudyError:
            if not opts.join:
                raise ConfigError(f"study {name!r} was just created by another search; add --join (or --resume) "
                                  "to work on it beside that one") from None
    return optuna.load_study(study_name=name, storage=store.storage, sampler=sampler), False


def _fail_stale(study: optuna.Study) -> None:
    """Fail trials of workers that died (Optuna's stale-trial recovery; live workers' trials are kept)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _enqueue_known(study: optuna.Study, opts: SearchOptions, space: SearchSpace, catalog: HardwareCatalog,
                   screened: Census | None, objectives: tuple[Objective, ...]) -> None:
    """Queue ``--seed-plan`` plans, then (multi-fidelity) the analytically best plans of the space."""
    for text in opts.seed_plans:
        study.enqueue_trial(seed_params(space, catalog, text), skip_if_exists=True)
    if screened is not None:
        top = opts.screen_top if opts.screen_top is not None else max(1, opts.budget // 2)
        for outcome in screened.ranked(objectives)[:top]:
            study.enqueue_trial(encode_choices(space, screened.choices[outcome.key]), skip_if_exists=True)


def _space_data(opts: SearchOptions) -> tuple[dict[str, Any], str]:
    path = resolve_space_path(opts.space)
    return dict(load_yaml_mapping(path)), str(path)


def _meta(storage: optuna.storages.BaseStorage, name: str, wait_s: float = 0.0) -> dict[str, Any]:
    """The setup the study was created with (a worker that just lost the race to create it waits for it)."""
    study_id = storage.get_study_id_from_name(name)
    deadline = time.monotonic() + wait_s
    meta = storage.get_study_user_attrs(study_id).get(META_ATTR)
    while meta is None and time.monotonic() < deadline:
        time.sleep(0.1)
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
    """Parameters of a known-good plan given as text (``--seed-plan``); hardware dims take their first value."""
    plan = Plan.parse(text, gpus=space.gpus[0] if "dp=" not in text else None)
    choices: dict[str, Any] = {"gpus": plan.gpus}
    for d in space.hw_dims:
        choices[d.name] = d.values[0]
    for d in space.plan_dims:
        choices[d.name] = getattr(plan, d.name)
    for name, value in space.fixed_plan.items():
        if getattr(plan, name) != value and not (name == "sp" and plan.tp == 1):
            raise ConfigError(f"--seed-plan {text!r}: {name}={getattr(plan, name)} but the space fixes {name}={value}")
    if plan.gbs != space.gbs and "gbs=" in text:
        raise ConfigError(f"--seed-plan {text!r}: gbs={plan.gbs} but the space trains with global_batch={space.gbs}")
    try:
        params = encode_choices(space, choices)
    except ConfigError as err:
        raise ConfigError(f"--seed-plan {text!r}: {err}") from None
    if len(space.gpus) == 1 and plan.gpus != space.gpus[0]:
        raise ConfigError(f"--seed-plan {text!r}: uses {plan.gpus} GPUs, the space has {space.gpus[0]}")
    make_candidate(space, catalog, space.complete({d.name: choices[d.name] for d in space.dims}))
    return params
