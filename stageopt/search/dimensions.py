"""The searched dimensions of a space and the prices of hardware choices (plain types).

Why apart from the space reader: candidates, the census and the loop work with
dimensions and values; only :mod:`stageopt.search.space` reads YAML.

Every dimension is suggested to Optuna over the same fixed range in every trial
(:meth:`Dimension.suggest`), so samplers see a static space. A :class:`Dimension`
lists its values (enumerable: the census can score every combination); a
:class:`Range` is a continuous or integer interval of a hardware field
(bandwidth, HBM capacity, ...), searched by Optuna around exact plan censuses.

Plan fields are read from :class:`stageopt.parallel.plan.Plan` itself
(:func:`plan_fields`), so a field or schedule added there is searchable with no
change here.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import optuna

from stageopt.errors import ConfigError
from stageopt.frameworks.profile import FP8_RECIPES
from stageopt.hardware import Hardware
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import MAX_COUNT, PLAN_BOUNDS, check_count
from stageopt.parallel.plan import CP_COMMS, DTYPES, GRAD_DTYPES, RECOMPUTE, SCHEDULES, Plan
from stageopt.parallel.plan_checks import DISPATCHERS

Value = Union[int, float, str, bool, None]

# Plan fields a space does not search directly: dp is derived (gpus / (tp*cp*pp)); the global
# batch is training.global_batch; the software stack is the space's ``framework`` key.
NOT_PLAN_DIMS = ("dp", "gbs", "framework")
CHOICES: dict[str, tuple[str, ...]] = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "dtype": tuple(DTYPES),
                                       "grad_dtype": GRAD_DTYPES, "cp_comm": CP_COMMS, "dispatcher": DISPATCHERS,
                                       "fp8_recipe": FP8_RECIPES}
HW_ALIASES = {"node_gpus": "node.gpus", "scaleout_gbps": "scaleout.bandwidth_gbps", "hbm_gib": "gpu.hbm_gib",
              "reserve_gib": "gpu.reserve_gib"}
OBJECTIVES = ("time", "throughput", "cost", "mfu")
BACKENDS = ("analytical", "replay", "astra-sim", "astra-sim-aware")
# Megatron-Core's uneven-split layer counts (--decoder-first/last-pipeline-num-layers): 0 means unset
LAYER_COUNTS = {"first_layers": (10**6, "a stage holds at most every layer")}
LAYER_COUNTS["last_layers"] = LAYER_COUNTS["first_layers"]
LAYER_COUNTS["dp_shard"] = (MAX_COUNT, "a share of the data-parallel ranks")  # 0 means all of dp
LAYER_COUNTS["etp"] = (MAX_COUNT, "a share of the tensor-parallel ranks")  # 0 means tp
LAYER_COUNTS["cp_a2a"] = (MAX_COUNT, "a share of the context-parallel ranks")  # 0: not hierarchical
LAYER_COUNTS["offload_layers"] = LAYER_COUNTS["first_layers"]  # 0: no activation offloading
LAYER_COUNTS["recompute_layers"] = LAYER_COUNTS["first_layers"]  # 0: full recompute re-runs every layer
LAYER_COUNTS["vpp_group"] = (MAX_COUNT, "a share of the micro-batches")  # 0: pp (Megatron-Core's default)
ZERO_MEANS = {"first_layers": "unset", "last_layers": "unset", "dp_shard": "all of dp", "etp": "tp",
              "cp_a2a": "no hierarchical CP", "offload_layers": "no offloading", "recompute_layers": "every layer",
              "vpp_group": "pp"}


def plan_fields() -> dict[str, Any]:
    """Searchable plan fields and their annotations, read from the Plan dataclass."""
    hints = typing.get_type_hints(Plan)
    return {f.name: hints[f.name] for f in dataclasses.fields(Plan) if f.name not in NOT_PLAN_DIMS}


PLAN_DIMS = tuple(plan_fields())
PLAN_DEFAULTS: dict[str, Value] = {f.name: f.default for f in dataclasses.fields(Plan)  # type: ignore[misc]
                                   if f.name in PLAN_DIMS}


def plan_value(name: str, item: Any, where: str) -> Value:
    """One value of plan field ``name`` as the space file wrote it, checked against the field's type."""
    tp = plan_fields()[name]
    optional = type(None) in typing.get_args(tp)
    if item is None or (isinstance(item, str) and item.lower() in ("default", "null", "none") and name not in CHOICES):
        if optional:
            return None  # the framework profile's default
        raise ConfigError(f"{where}: {shorten(item)} is not allowed; {name} has no framework default, give a value")
    base = tp if not optional else next(a for a in typing.get_args(tp) if a is not type(None))
    if base is bool:
        if isinstance(item, str) and item.lower() in ("on", "off", "true", "false"):
            item = item.lower() in ("on", "true")
        if not isinstance(item, bool):
            raise ConfigError(f"{where}: {shorten(item)} is not on/off")
        return item
    if base is int:
        return _plan_int(name, item, where)
    if name in CHOICES and item not in CHOICES[name]:
        raise ConfigError(f"{where}: {shorten(item)} is not one of {', '.join(CHOICES[name])}")
    if not isinstance(item, str):
        raise ConfigError(f"{where}: {shorten(item)} is not a name")
    return item


def _plan_int(name: str, item: Any, where: str) -> int:
    """An integer plan value within its bound (a typo such as 10^30 is refused, not overflowed)."""
    if name == "zero":
        if isinstance(item, bool) or item not in (0, 1, 2, 3):
            raise ConfigError(f"{where}: {shorten(item)} is not a ZeRO stage 0, 1, 2 or 3")
        return int(item)
    low = 0 if name in LAYER_COUNTS else 1
    high, why = LAYER_COUNTS.get(name) or PLAN_BOUNDS.get(name, (MAX_COUNT, ""))
    if isinstance(item, bool) or not isinstance(item, int) or item < low:
        kind = f"an integer in 0..{high} (0: {ZERO_MEANS[name]})" if low == 0 else "a positive integer"
        raise ConfigError(f"{where}: {shorten(item)} is not {kind}")
    return check_count(item, where, low=low, high=high, why=why)


@dataclass(frozen=True, kw_only=True, slots=True)
class Dimension:
    """One searched choice and its allowed values, suggested the same way in every trial.

    Every dimension is an Optuna categorical under its own name with its real
    values (``tp`` in 1, 2, 4, 8), so optuna-dashboard, ``trials_dataframe()`` and
    ``best_params`` show the plan as users write it.
    """

    name: str
    values: tuple[Value, ...]

    enumerable = True

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
class Range:
    """A continuous (or integer) interval of a hardware field: searched by Optuna, never enumerated."""

    name: str
    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False

    enumerable = False

    @property
    def param(self) -> str:
        return self.name

    @property
    def values(self) -> tuple[Value, ...]:
        raise ConfigError(f"{self.name} is a range [{self.low:g}, {self.high:g}], not a list; it cannot be enumerated")

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.integer:
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log,
                                                        step=int(self.step or 1))
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial: optuna.trial.BaseTrial) -> Value:
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)

    def decode(self, params: Mapping[str, Any]) -> Value:
        return params[self.name]

    def encode(self, value: Value) -> Any:
        if not isinstance(value, (int, float)) or not self.low <= value <= self.high:
            raise ConfigError(f"{self.name}={value} is outside the space's range [{self.low:g}, {self.high:g}]")
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
