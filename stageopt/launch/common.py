"""What every export target shares: the result type, the target of a framework profile, the layer placement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stageopt.errors import ConfigError
from stageopt.frameworks import FrameworkProfile
from stageopt.model import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.workload.sharding import layer_counts

TARGETS = ("megatron", "megatron-bridge", "torchtitan")


@dataclass(frozen=True)
class LaunchSettings:
    """A framework's settings for one plan: ``text`` to paste, ``settings`` as data, ``notes`` on what differs."""

    target: str
    text: str
    settings: dict[str, Any]
    notes: tuple[str, ...] = field(default=())


def targets_of(profile: FrameworkProfile) -> tuple[str, ...]:
    """Export targets that run plans of this profile, the default first (megatron-core -> megatron, ...)."""
    if profile.name.startswith("megatron-core") or profile.name.startswith("megatron-lm"):
        return ("megatron", "megatron-bridge")
    if profile.name.startswith("torchtitan"):
        return ("torchtitan",)
    return ()


def chunk_layers(model: ModelSpec, plan: Plan) -> list[int]:
    """Transformer layers of each virtual pipeline chunk, in chunk order (stage s, local chunk v: v * pp + s).

    The same placement the simulators used (remainders on the middle chunks), so
    the exported run has the stages that were simulated.
    """
    return layer_counts(model, plan)


def refuse(target: str, what: str, fix: str) -> ConfigError:
    return ConfigError(f"export --to {target}: {what}; {fix}")
