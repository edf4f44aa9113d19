"""The simulator behind ``--backend``: a shipped name, or ``package.module:Class`` for your own.

Why ``module:Class``: a backend is a :class:`~stageopt.sim.base.Simulator`
subclass (the instance is passed in, no registry); naming one by import path
lets a study use a simulator that lives outside stageopt (and lets tests use a
slow stand-in) without editing this package.
"""

from __future__ import annotations

import importlib

from stageopt.errors import ConfigError
from stageopt.sim.base import Simulator

SHIPPED = ("analytical", "replay", "astra-sim", "astra-sim-aware")


def make_simulator(name: str, *, astra_sim: str | None = None, timeout_s: float = 600.0) -> Simulator | None:
    """The backend's simulator; ``None`` for the analytical model (evaluated in-process in batches)."""
    if name == "analytical":
        return None
    if name == "replay":
        from stageopt.sim.replay import ReplaySimulator

        return ReplaySimulator()
    if name in ("astra-sim", "astra-sim-aware"):  # -aware: ASTRA-sim's congestion-aware binary (1-D networks)
        from stageopt.astrasim.runner import find_astra_sim
        from stageopt.sim.astrasim_backend import AstraSimSimulator

        network = "aware" if name.endswith("-aware") else "unaware"
        find_astra_sim(astra_sim, network)  # a missing binary is a usage error now, not a failed trial per plan
        return AstraSimSimulator(binary=astra_sim, timeout_s=timeout_s, network=network)
    module_name, sep, class_name = name.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"--backend {name!r} unknown; use {', '.join(SHIPPED)} or package.module:SimulatorClass")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"--backend {name!r}: cannot import ({err}); check the module path") from None
    if not (isinstance(cls, type) and issubclass(cls, Simulator)):
        raise ConfigError(f"--backend {name!r} is not a stageopt.sim.base.Simulator subclass")
    return cls()
