"""Old import paths kept working for one release after the package layout changed (0.2).

Why a finder instead of shim modules: a shim file per old path would put a
second module of the same name beside the real one. Importing an old path
returns the new module itself (so ``isinstance`` checks and monkeypatching see
one object) and emits a :class:`DeprecationWarning` naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

MOVED: dict[str, str] = {
    "stageopt.hardware_efficiency": "stageopt.hardware.efficiency",
    "stageopt.hardware_collectives": "stageopt.hardware.collectives",
    "stageopt.hardware_astrasim": "stageopt.astrasim.config_writer",
    "stageopt.memory": "stageopt.workload.memory",
    "stageopt.stage_stats": "stageopt.workload.stats",
    "stageopt.report": "stageopt.workload.summary",
    "stageopt.graph.program": "stageopt.graph.block",
    "stageopt.graph.blocks": "stageopt.graph.templates",
    "stageopt.parallel.validate": "stageopt.parallel.feasibility",
    "stageopt.sim.network_model": "stageopt.hardware.network",
    "stageopt.sim.astrasim": "stageopt.sim.astrasim_backend",
    "stageopt.sim.astrasim_runner": "stageopt.astrasim.runner",
    "stageopt.sim.astra_configs": "stageopt.astrasim.configs",
    "stageopt.sim.collectives": "stageopt.astrasim.collective_timing",
    "stageopt.sim.events": "stageopt.astrasim.events",
    "stageopt.sim.replay_compat": "stageopt.astrasim.trace_replay",
    "stageopt.search.report": "stageopt.search.artifacts",
    "stageopt.chakra.schema": "stageopt.chakra.et_schema",
    "stageopt.commands._common": "stageopt.commands.arguments",
    "stageopt.commands.inspect": "stageopt.commands.inspect_command",
    "stageopt.commands.simulate": "stageopt.commands.simulate_command",
    "stageopt.commands.presets": "stageopt.commands.presets_command",
    "stageopt.commands.validate_trace": "stageopt.commands.validate_trace_command",
    "stageopt.commands.replay": "stageopt.commands.replay_command",
    "stageopt.commands.generate": "stageopt.commands.generate_command",
    "stageopt.commands.search": "stageopt.commands.search_command",
    "stageopt.commands.report": "stageopt.commands.report_command",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):  # noqa: D102 - importlib hook
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:  # noqa: D102 - the new module is already executed
        return None


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - importlib hook
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; the old path goes away in stageopt 0.3",
                      DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
