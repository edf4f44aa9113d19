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

PLAN_DIMS = ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "sp", "schedule")
PLAN_DEFAULTS: dict[str, Value] = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "zero": 0,
                                   "recompute": "none", "sp": False, "schedule": "1f1b"}
HW_DIMS = ("hardware", "node_gpus", "scaleout_gbps", "hbm_gib")
HW_SET_KEYS = {"node_gpus": "node.gpus", "scaleout_gbps": "scaleout.bandwidth_gbps", "hbm_gib": "gpu.hbm_gib"}
OBJECTIVES = ("time", "throughput", "cost", "mfu")
BACKENDS = ("analytical", "replay", "astra-sim", "astra-sim-aware")


@dataclass(frozen=True, kw_only=True, slots=True)
class Dimension:
    """One searched choice and its allowed values, suggested the same way in every trial.

    Integer choices that are consecutive powers of two are suggested as an integer
    exponent (``log2_tp`` in 0..3 for tp in 1, 2, 4, 8) so TPE and GP see their
    order; anything else is categorical.
    """

    name: str
    values: tuple[Value, ...]

    @property
    def log2(self) -> bool:
        ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.values)
        if not ints or len(self.values) < 2:
            return False
        exps = [int(v).bit_length() - 1 for v in self.values]  # type: ignore[arg-type]
        return (all(1 << e == v for e, v in zip(exps, self.values))
                and sorted(exps) == list(range(min(exps), max(exps) + 1)))

    @property
    def param(self) -> str:
        """The Optuna parameter name."""
        return f"log2_{self.name}" if self.log2 else self.name

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.log2:
            exps = [int(v).bit_length() - 1 for v in self.values]  # type: ignore[arg-type]
            return optuna.distributions.IntDistribution(min(exps), max(exps))
        return optuna.distributions.CategoricalDistribution(self.values)

    def suggest(self, trial: optuna.trial.BaseTrial) -> Value:
        if self.log2:
            dist = self.distribution()
            return 1 << trial.suggest_int(self.param, dist.low, dist.high)  # type: ignore[attr-defined]
        return trial.suggest_categorical(self.name, self.values)  # type: ignore[arg-type]

    def decode(self, params: Mapping[str, Any]) -> Value:
        """The value a stored trial's parameters chose."""
        raw = params[self.param]
        return 1 << int(raw) if self.log2 else raw

    def encode(self, value: Value) -> Any:
        """The stored parameter for ``value`` (used to enqueue known plans)."""
        if value not in self.values:
            raise ConfigError(f"{self.name}={value} is not in the space's values {list(self.values)}")
        return int(value).bit_length() - 1 if self.log2 else value  # type: ignore[arg-type]


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
