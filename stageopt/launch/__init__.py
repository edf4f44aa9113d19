"""Owns the translation of a plan into a training framework's launch settings (``stageopt export``).

A plan stageopt simulated is only useful if it can be run: this package turns a
``Plan`` on a ``ModelSpec`` into Megatron-LM / Megatron-Core command-line
arguments, Megatron-Bridge (NeMo 2) recipe overrides or a torchtitan TOML file, including the execution options of the
plan's framework profile (attention kernel, dropout, overlap, optimizer
sharding), with the flag names those frameworks document. Imports ``model``,
``frameworks``, ``parallel`` and ``workload`` (for the layer placement).
"""

from stageopt.launch.bridge import bridge_settings
from stageopt.launch.common import TARGETS, LaunchSettings, refuse, targets_of
from stageopt.launch.megatron import megatron_settings
from stageopt.launch.torchtitan import torchtitan_settings
from stageopt.model import ModelSpec
from stageopt.parallel.plan import Plan

__all__ = ["TARGETS", "LaunchSettings", "bridge_settings", "launch_settings", "megatron_settings", "targets_of",
           "torchtitan_settings"]


def launch_settings(target: str, model: ModelSpec, plan: Plan) -> LaunchSettings:
    """The launch settings of ``plan`` on ``model`` for ``target`` (one of :data:`TARGETS`)."""
    if model.parallel_block != "off":  # none of the targets builds attention and MLP side by side
        raise refuse(target, f"model field parallel_block={model.parallel_block} (attention and MLP side by side) is "
                     f"not a layer {target} builds", "export a sequential model (parallel_block=off) or run the "
                     "plan on a stack that has the block (GPT-NeoX's library)")
    exporters = {"megatron": megatron_settings, "megatron-bridge": bridge_settings, "torchtitan": torchtitan_settings}
    return exporters[target](model, plan)
