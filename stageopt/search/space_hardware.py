"""The hardware part of a space: the ``codesign`` section (presets, any hardware field) and ``cost``.

Why apart from the plan part: hardware values are checked by building the machine they
describe (every preset, every value), and a hardware field may be a continuous range that
only Optuna searches, never the census.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten
from stageopt.hardware import apply_hw_overrides, hw_override_keys, list_hardware_presets, load_hardware
from stageopt.search.dimensions import HW_ALIASES, CostModel, Dimension, Range, Value
from stageopt.search.space_readers import check_keys, mapping, nonneg_float, pos_float, pos_int, str_list

_RANGE_KEYS = ("low", "high", "log", "step")

Dim = Union[Dimension, Range]


def hw_dims(section: Mapping[str, Any], hardware: str, hw_set: tuple[str, ...], where: str) -> tuple[Dim, ...]:
    """Hardware dimensions: ``hardware`` (presets), the short names, or any ``--hw-set`` key; a list of
    values (enumerated) or ``{low, high, log, step}`` (a range Optuna searches)."""
    allowed = ("hardware", *HW_ALIASES, *hw_override_keys())
    check_keys(section, allowed, f"{where}: codesign")
    presets = [hardware]
    if "hardware" in section:
        presets = str_list(section["hardware"], f"{where}: codesign.hardware")
    for preset in dict.fromkeys([hardware, *presets]):
        try:
            apply_hw_overrides(load_hardware(preset), hw_set)
        except ConfigError as err:
            raise ConfigError(f"{where}: hardware {shorten(preset)}: {err}") from None
    dims: list[Dim] = []
    for name, raw in section.items():
        at = f"{where}: codesign.{name}"
        if name == "hardware":
            values: list[Value] = list(dict.fromkeys(presets))
            if len(values) != len(presets):
                raise ConfigError(f"{at} must list distinct presets, got {shorten(raw)}")
            dims.append(Dimension(name=name, values=tuple(values)))
            continue
        path = HW_ALIASES.get(name, name)
        if isinstance(raw, Mapping):
            dims.append(_range(name, raw, at))
            for bound in (dims[-1].low, dims[-1].high):  # type: ignore[union-attr]
                _check_hw_value(presets, hw_set, path, bound, at)
            continue
        values = list(raw) if isinstance(raw, list) else [raw]
        if not values or len(set(map(str, values))) != len(values):
            raise ConfigError(f"{at} must list distinct values, got {shorten(raw)}")
        for value in values:
            _check_hw_value(presets, hw_set, path, value, at)
        dims.append(Dimension(name=name, values=tuple(values)))
    return tuple(dims)


def _check_hw_value(presets: list[str], hw_set: tuple[str, ...], path: str, value: Any, where: str) -> None:
    """A hardware value must build a valid machine on every preset (the schema checks type and range)."""
    for preset in presets:
        try:
            apply_hw_overrides(load_hardware(preset), [*hw_set, f"{path}={value}"])
        except ConfigError as err:
            raise ConfigError(f"{where}: {shorten(value)}: {err}") from None


def _range(name: str, raw: Mapping[str, Any], where: str) -> Range:
    check_keys(raw, _RANGE_KEYS, where)
    if "low" not in raw or "high" not in raw:
        raise ConfigError(f"{where}: a range needs low and high, e.g. {{low: 25, high: 400, log: true}}")
    low, high = pos_float(raw["low"], f"{where}.low"), pos_float(raw["high"], f"{where}.high")
    if low >= high:
        raise ConfigError(f"{where}: low {low:g} must be below high {high:g}")
    step = None if raw.get("step") is None else pos_float(raw["step"], f"{where}.step")
    integer = all(isinstance(raw[k], int) and not isinstance(raw[k], bool) for k in ("low", "high")) and (
        step is None or float(step).is_integer())
    return Range(name=name, low=low, high=high, log=bool(raw.get("log", False)), step=step, integer=integer)


_COST_KEYS = ("gpu_hour_usd", "node_gpus_usd_per_gpu_hour", "scaleout_usd_per_gbps_per_gpu_hour",
              "hbm_usd_per_gib_per_gpu_hour")


def cost_model(section: Mapping[str, Any], where: str) -> CostModel:
    check_keys(section, _COST_KEYS, f"{where}: cost")
    prices = mapping(section.get("gpu_hour_usd", {}), f"{where}: cost.gpu_hour_usd")
    known = list_hardware_presets()
    for preset, price in prices.items():
        if str(preset) not in known and not str(preset).endswith((".yaml", ".yml")):
            raise ConfigError(f"{where}: cost.gpu_hour_usd: {shorten(preset)} is not a hardware preset ({', '.join(known)})")
        pos_float(price, f"{where}: cost.gpu_hour_usd.{preset}")
    node = mapping(section.get("node_gpus_usd_per_gpu_hour", {}), f"{where}: cost.node_gpus_usd_per_gpu_hour")
    return CostModel(
        gpu_hour_usd={str(k): float(v) for k, v in prices.items()},
        node_gpus_usd_per_gpu_hour={pos_int(int(k) if str(k).isdigit() and len(str(k)) < 20 else k,
                                             f"{where}: cost.node_gpus_usd_per_gpu_hour"):
                                    nonneg_float(v, f"{where}: cost.node_gpus_usd_per_gpu_hour.{k}")
                                    for k, v in node.items()},
        scaleout_usd_per_gbps_per_gpu_hour=nonneg_float(section.get("scaleout_usd_per_gbps_per_gpu_hour", 0.0),
                                                         f"{where}: cost.scaleout_usd_per_gbps_per_gpu_hour"),
        hbm_usd_per_gib_per_gpu_hour=nonneg_float(section.get("hbm_usd_per_gib_per_gpu_hour", 0.0),
                                                   f"{where}: cost.hbm_usd_per_gib_per_gpu_hour"))
