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
from stageopt.search.backends import make_simulator
from stageopt.search.cache import StudyCache
from stageopt.search.candidate import HardwareCatalog
from stageopt.search.census import Census, require_feasible, take_census
from stageopt.search.confirm import Confirmation, ConfirmConfig
from stageopt.search.driver import LoopConfig, LoopStats, SearchLoop
from stageopt.search.exact import exact_search
from stageopt.search.executors import RayExecutor
from stageopt.search.objective import Objective, objectives_for
from stageopt.search.outer import OuterLoop
from stageopt.search.samplers import make_sampler
from stageopt.search.seeds import enqueue_known, seed_candidate
from stageopt.search.space import SearchSpace, check_objectives, resolve_space_path, space_from_dict
from stageopt.search.storage import StudyStorage, check_study_name, open_storage, study_exists
from stageopt.search.strategy import Answer, census_answer, pick_mode, sampled_answer
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
    storage: StudyStorage | None = None

    @property
    def loop(self) -> SearchLoop | None:
        """The sampled loop (None when the census answered or confirmed, or in a co-design outer loop)."""
        return self.answer.loop


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
    """Open, resume or join the study, then answer it the way :func:`~stageopt.search.strategy.pick_mode` says:
    the exact census, census-guided confirmation, the sampled loop, or the co-design outer loop."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_options(opts)
    setup = _setup(opts)
    space, backend, store = setup.space, setup.backend, setup.store
    objectives = objectives_for(setup.names)
    simulator = make_simulator(backend, astra_sim=opts.astra_sim, timeout_s=opts.timeout_s)
    screen = opts.screen or (space.screen if simulator is not None else None)
    if screen and simulator is None:
        raise ConfigError("--screen analytical needs an expensive backend (--backend replay or astra-sim)")
    catalog = HardwareCatalog(space, reserve_gib=opts.reserve_gib)
    mode = pick_mode(opts.sampler, simulator is not None, space)
    census, started = None, time.perf_counter()
    if mode != "outer":
        census = take_census(space, catalog, seed=opts.seed or 0, progress=opts.progress)
        require_feasible(census, space)
    sampler = make_sampler(opts.sampler, opts.seed, len(objectives))
    setup.new_meta.update(mode=mode, reserve_gib=opts.reserve_gib, census=census_summary(census))
    address = _ray_address(opts)
    workers = opts.workers or (None if address else os.cpu_count() or 1)
    executor = (RayExecutor(simulator, workers=workers, address=address, timeout_s=opts.timeout_s)
                if simulator is not None else None)  # before the study: a bad Ray address writes nothing
    try:
        study, meta, created = _prepare_study(store, setup.name, sampler, objectives, setup.exists, opts,
                                              setup.meta, setup.new_meta)
        cache = StudyCache(study, store.claim_lock)
        if mode == "sample":
            top = opts.screen_top if opts.screen_top is not None else max(1, opts.budget // 2)
            enqueue_known(study, opts.seed_plans, space, catalog, census if screen and created else None,
                          objectives, top)
    except BaseException:
        if executor is not None:
            executor.close()
        raise
    parts = _Parts(study=study, space=space, objectives=objectives, catalog=catalog, cache=cache, census=census,
                   executor=executor, backend=backend, sync=store.sync, started=started)
    with HeartbeatKeeper(store.storage, HEARTBEAT_INTERVAL_S) as heartbeat:
        with warnings.catch_warnings():  # Optuna's note that heartbeats are meant for Study.optimize
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            answer = _answer(mode, opts, parts, heartbeat, progress)
    return SearchResult(study=study, space=space, objectives=objectives, backend=backend, run_dir=setup.run_dir,
                        stats=answer.stats, answer=answer, census=census, meta=meta, storage=store)


@dataclass(frozen=True)
class _Parts:
    """What every mode works on, built by :func:`run_search`."""

    study: optuna.Study
    space: SearchSpace
    objectives: tuple[Objective, ...]
    catalog: HardwareCatalog
    cache: StudyCache
    census: Census | None
    executor: RayExecutor | None
    backend: str
    sync: Callable[[], None]
    started: float  # perf_counter before the census (an exact answer's time is the census's)


def _answer(mode: str, opts: SearchOptions, p: _Parts, heartbeat: HeartbeatKeeper,
            progress: Callable[[SearchLoop], None] | None) -> Answer:
    """Run the mode :func:`~stageopt.search.strategy.pick_mode` chose."""
    if mode == "outer":
        return OuterLoop(study=p.study, space=p.space, objectives=p.objectives, catalog=p.catalog, cache=p.cache,
                         executor=p.executor, budget=opts.budget, backend=p.backend, heartbeat=heartbeat,
                         progress=opts.progress).run()
    census = p.census
    assert census is not None
    if mode == "exact":
        seeds = [seed_candidate(p.space, p.catalog, text) for text in opts.seed_plans]
        exact = exact_search(p.space, census, p.objectives, p.cache, opts.top, seeds)
        p.sync()
        stats = LoopStats(told=exact.recorded, stop_reason="exact census",
                          elapsed_s=time.perf_counter() - p.started)
        return census_answer(mode, stats, p.cache, census, p.objectives, p.backend, [exact.line])
    if mode == "confirm":
        assert p.executor is not None
        seeds = [seed_candidate(p.space, p.catalog, text) for text in opts.seed_plans]
        config = ConfirmConfig(budget=opts.budget, backend=p.backend, seed=opts.seed or 0,
                               use_model=opts.sampler == "auto", progress=opts.progress)
        conf = Confirmation(study=p.study, space=p.space, census=census, objectives=p.objectives, catalog=p.catalog,
                            cache=p.cache, executor=p.executor, config=config, heartbeat=heartbeat)
        stats = conf.run(seeds)
        p.sync()
        return census_answer(mode, stats, p.cache, census, p.objectives, p.backend, [])
    max_asks = opts.max_asks if opts.max_asks is not None else 20 * opts.budget + len(p.study.trials)
    config = LoopConfig(budget=opts.budget, max_asks=max_asks, batch=opts.batch, backend=p.backend,
                        refine=opts.sampler in ("tpe", "auto"))
    loop = SearchLoop(study=p.study, space=p.space, objectives=p.objectives, catalog=p.catalog, cache=p.cache,
                      census=census, config=config, executor=p.executor, sync=p.sync, heartbeat=heartbeat,
                      synchronous=opts.seed is not None or p.executor is None, progress=progress)
    return sampled_answer(loop, census, p.objectives, p.backend)


def census_summary(census: Census | None) -> dict[str, Any] | None:
    """What the study keeps about the census: its size, completeness and what was merged or dropped."""
    if census is None:
        return None
    return {"combinations": census.combos, "exhaustive": census.exhaustive, "valid_plans": len(census),
            "feasible_plans": census.n_feasible, "merged_by_canonical_rules": census.merged,
            "invalid_by_rule": dict(census.invalid_reasons.most_common(10))}


def check_options(opts: SearchOptions) -> None:
    """One-line errors for numbers that cannot describe a search (before anything is written)."""
    if opts.budget < 1:
        raise ConfigError(f"--budget {opts.budget}: must be at least 1 (unique simulations)")
    if opts.workers is not None and opts.workers < 1:
        raise ConfigError(f"--workers {opts.workers}: must be at least 1")
    if opts.reserve_gib is not None and (not math.isfinite(opts.reserve_gib) or opts.reserve_gib < 0):
        raise ConfigError(f"--reserve-gib {opts.reserve_gib:g}: must be >= 0 (GiB kept free per GPU)")
    if opts.top < 1:
        raise ConfigError(f"--top {opts.top}: must be at least 1")
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


def _space_data(opts: SearchOptions) -> tuple[dict[str, Any], str]:
    path = resolve_space_path(opts.space)
    data = dict(load_yaml_mapping(path))
    if opts.framework:
        data["framework"] = opts.framework
    return data, str(path)


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
