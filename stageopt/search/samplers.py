"""The strategy and Optuna sampler for ``--sampler``.

``auto`` (the default) uses each tool for what it is best at: with the analytical
backend on an enumerable space the census is the exact answer; with an expensive
backend the census ranks every plan and the budget confirms the most promising
(:mod:`stageopt.search.confirm`); hardware ranges are searched by Optuna around
exact plan censuses (:mod:`stageopt.search.outer`). ``brute`` and ``grid`` are the
census itself (every plan, in analytical order for an expensive backend). The
Optuna samplers (``tpe``, ``nsga2``, ``gp``, ``cmaes``, ``random``) sample the
space anyway, e.g. to compare them with the exact answer.

Why not Optuna's defaults: for several objectives Optuna 5.0 picks a sampler
that, in our measurements, re-proposed duplicates until only 161-230 of 1,500
asks were unique configurations; TPE with ``multivariate=True`` (dimensions of a
plan interact: tp*pp*cp must divide the GPU count) or NSGA-II do not.
Constraints are read from each trial (``Trial.set_constraint``), so no sampler
needs a constraints function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stageopt.errors import ConfigError

if TYPE_CHECKING:
    import optuna

SAMPLERS = ("auto", "tpe", "nsga2", "gp", "cmaes", "random", "grid", "brute")
CENSUS_SAMPLERS = ("auto", "grid", "brute")


def make_sampler(name: str, seed: int | None, n_objectives: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler behind a sampled search (``auto``, ``grid`` and ``brute`` sample with TPE
    only where they cannot enumerate: the hardware ranges of an outer loop)."""
    import optuna

    if name in ("tpe", *CENSUS_SAMPLERS):
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=20)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=40)
    if name == "gp":
        if n_objectives > 3:
            raise ConfigError("--sampler gp handles at most 3 objectives; use tpe or nsga2")
        return optuna.samplers.GPSampler(seed=seed)
    if name == "cmaes":
        if n_objectives > 1:
            raise ConfigError("--sampler cmaes handles one objective; use tpe or nsga2 for several")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"--sampler {name!r} unknown; use one of {', '.join(SAMPLERS)}")
