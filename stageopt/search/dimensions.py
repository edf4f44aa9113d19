"""The searched dimensions of a space and the prices of hardware choices (plain types).

Why apart from the space reader: candidates, the census and the loop work with
dimensions and values; only :mod:`stageopt.search.space` reads YAML.

Every dimension is suggested to Optuna over the same fixed range in every trial
(:meth:`Dimension.suggest`), so samplers see a static space.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import optuna

from stageopt.errors import ConfigError
from stageopt.hardware import Hardware

Value = Union[int, float, str, bool]

PLAN_DIMS = ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "sp", "schedule",
             "first_layers", "last_layers", "embed_split", "loss_split", "cp_comm")
PLAN_DEFAULTS: dict[str, Value] = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "zero": 0,
                                   "recompute": "none", "sp": False, "schedule": "1f1b",
                                   "first_layers": 0, "last_layers": 0, "embed_split": False, "loss_split": False,
                                   "cp_comm": "all_gather"}
HW_DIMS = ("hardware", "node_gpus", "scaleout_gbps", "hbm_gib")
HW_SET_KEYS = {"node_gpus": "node.gpus", "scaleout_gbps": "scaleout.bandwidth_gbps", "hbm_gib": "gpu.hbm_gib"}
OBJECTIVES = ("time", "throughput", "cost", "mfu")
BACKENDS = ("analytical", "replay", "astra-sim", "astra-sim-aware")


@dataclass(frozen=True, kw_only=True, slots=True)
class Dimension:
    """One searched choice and its allowed values, suggested the same way in every trial.

    Every dimension is an Optuna categorical under its own name with its real
    values (``tp`` in 1, 2, 4, 8), so optuna-dashboard, ``trials_dataframe()`` and
    ``best_params`` show the plan as users write it.
    """

    name: str
    values: tuple[Value, ...]

    @property
    def param(self) -> str:
        """The Optuna parameter name (the dimension's own)."""
        return self.name

    def distribution(self) -> optuna.distributions.BaseDistribution:
        return optuna.distributions.CategoricalDistribution(self.values)

    def suggest(self, trial: optuna.trial.BaseTrial) -> Value:
        return trial.suggest_categorical(self.name, self.values)  # type: ignore[arg-type]

    def decode(self, params: Mapping[str, Any]) -> Value:
        """The value a stored trial's parameters chose."""
        return params[self.name]

    def encode(self, value: Value) -> Any:
        """The stored parameter for ``value`` (used to enqueue known plans)."""
        if value not in self.values:
            raise ConfigError(f"{self.name}={value} is not in the space's values {list(self.values)}")
        return value


@dataclass(frozen=True, kw_only=True, slots=True)
class CostModel:
    """USD per GPU-hour of a hardware choice: the preset's price (or an override) plus network/HBM extras."""

    gpu_hour_usd: Mapping[str, float]
    node_gpus_usd_per_gpu_hour: Mapping[int, float]
    scaleout_usd_per_gbps_per_gpu_hour: float = 0.0
    hbm_usd_per_gib_per_gpu_hour: float = 0.0

    def per_gpu_hour(self, preset: str, hw: Hardware, base: Hardware) -> float:
        price = self.gpu_hour_usd.get(preset, hw.cost_per_gpu_hour)
        price += self.node_gpus_usd_per_gpu_hour.get(hw.node.gpus, 0.0)
        price += self.scaleout_usd_per_gbps_per_gpu_hour * (hw.scaleout.bandwidth_gbps - base.scaleout.bandwidth_gbps)
        price += self.hbm_usd_per_gib_per_gpu_hour * (hw.gpu.hbm_gib - base.gpu.hbm_gib)
        return price
