"""One public function from the user's words to an estimate: what ``stageopt simulate`` runs.

Why one function: validation against published runs, experiments and the CLI
must take the same path (model preset + overrides, plan string, framework
profile, hardware preset + overrides), so a figure measured in a script is the
tool's accuracy and not a private variant of it.
"""

from __future__ import annotations

from collections.abc import Sequence

from stageopt.frameworks import load_profile
from stageopt.hardware import Hardware, apply_hw_overrides, load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.base import Estimate, Simulator
from stageopt.workload import Workload, build_workload


def workload_for(model: str, plan: str, gpus: int | None, *, framework: str | None = None,
                 model_set: Sequence[str] = ()) -> Workload:
    """The sharded workload of a model (preset, YAML or config.json) under a plan string."""
    spec = load_model(model, list(model_set))
    profile = load_profile(framework) if framework else None
    return build_workload(spec, Plan.parse(plan, gpus=gpus, framework=profile), gpus)


def hardware_for(hardware: str, hw_set: Sequence[str] = ()) -> Hardware:
    """A hardware preset or YAML file with ``key=value`` overrides applied."""
    return apply_hw_overrides(load_hardware(hardware), list(hw_set))


def simulate_plan(model: str, plan: str, gpus: int | None, *, hardware: str = "h100-sxm",
                  framework: str | None = None, model_set: Sequence[str] = (), hw_set: Sequence[str] = (),
                  simulator: Simulator | None = None) -> tuple[Workload, Estimate]:
    """Estimate one iteration exactly as ``stageopt simulate`` does (analytical unless ``simulator`` is given)."""
    work = workload_for(model, plan, gpus, framework=framework, model_set=model_set)
    hw = hardware_for(hardware, hw_set)
    return work, (simulator or AnalyticalSimulator()).evaluate(work, hw)
