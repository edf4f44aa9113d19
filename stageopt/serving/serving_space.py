"""Serving search spaces: a YAML file with ``kind: serving`` says what deployment question to answer.

Why its own reader: a serving question has traffic and SLOs instead of a global
batch, and plan dimensions of its own (deployment mode, batch caps, chunk size,
dtypes). ``stageopt search --space F`` hands a file whose top-level ``kind`` is
``serving`` here (:func:`is_serving_space`); every other space goes to the
training search unchanged. Unknown keys and bad values are one-line errors
naming the key. Schema (all lists may be a single value)::

    kind: serving
    name: serve-llama3-70b
    model: llama3-70b            # preset, YAML or config.json; model_set: [key=value, ...]
    traffic: {rate: 40, input: normal:2048:512, output: normal:256:64, requests: 1500}
    slo: {ttft_ms: 2000, tpot_ms: 50, percentile: 90}
    cluster: {hardware: [h100-sxm, h200-sxm], gpus: [8, 16, 32, 64], hw_set: []}
    plan:
      mode: [colocated, disaggregated]
      tp: [2, 4, 8]
      pp: [1, 2]
      ep: [1]
      dpa: [off]
      max_seqs: [128, 256, 512]
      max_tokens: [2048, 8192]
      wdtype: [bf16, fp8]
      kvdtype: [bf16]
    cost: {gpu_hour_usd: {h100-sxm: 3.0}}   # default: each preset's cost_per_gpu_hour
    simulate: 12                 # admissible deployments, cheapest first, the request simulation checks
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stageopt.errors import ConfigError
from stageopt.hardware import apply_hw_overrides, load_hardware
from stageopt.inputs.schema import load_yaml_mapping
from stageopt.model import load_model
from stageopt.model.spec import ModelSpec
from stageopt.serving.serve_plan import DTYPES
from stageopt.serving.traffic import Slo, Traffic, slo_from_dict, traffic_from_dict

KIND = "serving"
TOP_KEYS = ("kind", "name", "description", "model", "model_set", "traffic", "slo", "cluster", "plan", "cost",
            "simulate")
CLUSTER_KEYS = ("hardware", "gpus", "hw_set")
PLAN_KEYS = ("mode", "tp", "pp", "ep", "dpa", "max_seqs", "max_tokens", "wdtype", "kvdtype")
MODES = ("colocated", "disaggregated")
PLAN_DEFAULTS: dict[str, tuple] = {"mode": ("colocated",), "tp": (1, 2, 4, 8), "pp": (1,), "ep": (1,),
                                   "dpa": (False,), "max_seqs": (256,), "max_tokens": (8192,),
                                   "wdtype": ("bf16",), "kvdtype": ("bf16",)}


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingSpace:
    name: str
    description: str
    source: str
    model: ModelSpec
    model_source: str
    traffic: Traffic
    slo: Slo
    hardware: tuple[str, ...]
    gpus: tuple[int, ...]
    hw_set: tuple[str, ...]
    plan: Mapping[str, tuple]
    prices: Mapping[str, float]
    simulate: int = 12

    def size_hint(self) -> int:
        n = len(self.hardware) * len(self.gpus)
        for values in self.plan.values():
            n *= len(values)
        return n


def is_serving_space(path: Path) -> bool:
    """True when the YAML file's top-level ``kind`` is ``serving``."""
    data = load_yaml_mapping(path)
    return data.get("kind") == KIND


def _check_keys(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown key '{key}'; {hint}")


def _section(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key} must be a mapping, got {value!r}")
    return value


def _values(raw: Any, key: str, where: str) -> tuple:
    items = tuple(raw) if isinstance(raw, list) else (raw,)
    if not items or len(set(map(str, items))) != len(items):
        raise ConfigError(f"{where}: {key} must list distinct values, got {raw!r}")
    out = []
    for item in items:
        if key == "mode" and item not in MODES:
            raise ConfigError(f"{where}: plan.mode {item!r} unknown; use {' or '.join(MODES)}")
        if key in ("wdtype", "kvdtype") and item not in DTYPES:
            raise ConfigError(f"{where}: plan.{key} {item!r} unknown; use one of {', '.join(DTYPES)}")
        if key == "dpa":
            if isinstance(item, str) and item in ("on", "off"):
                item = item == "on"
            if not isinstance(item, bool):
                raise ConfigError(f"{where}: plan.dpa {item!r} must be on or off")
        elif key not in ("mode", "wdtype", "kvdtype", "hardware") and (isinstance(item, bool) or not isinstance(item, int)
                                                            or item < 1):
            raise ConfigError(f"{where}: {key} {item!r} must be a positive integer")
        out.append(item)
    return tuple(out)


def load_serving_space(path: Path) -> ServingSpace:
    where = str(path)
    data = load_yaml_mapping(path)
    _check_keys(data, TOP_KEYS, where)
    for key in ("model", "traffic", "cluster"):
        if key not in data:
            raise ConfigError(f"{where}: missing '{key}' section; see stageopt/serving/serving_space.py")
    model_set = [str(v) for v in (data.get("model_set") or [])]
    try:
        model = load_model(str(data["model"]), model_set)
    except ConfigError as err:
        raise ConfigError(f"{where}: model: {err}") from None
    traffic = traffic_from_dict(dict(_section(data, "traffic", where)), f"{where}: traffic")
    slo = slo_from_dict(dict(_section(data, "slo", where)), f"{where}: slo")
    cluster = _section(data, "cluster", where)
    _check_keys(cluster, CLUSTER_KEYS, f"{where}: cluster")
    hardware = _values(cluster.get("hardware", "h100-sxm"), "hardware", where)
    hw_set = tuple(str(v) for v in (cluster.get("hw_set") or []))
    for preset in hardware:
        try:
            apply_hw_overrides(load_hardware(str(preset)), list(hw_set))
        except ConfigError as err:
            raise ConfigError(f"{where}: cluster.hardware {preset!r}: {err}") from None
    if "gpus" not in cluster:
        raise ConfigError(f"{where}: cluster.gpus is missing; give the GPU counts to consider, e.g. [8, 16, 32]")
    gpus = _values(cluster["gpus"], "gpus", where)
    plan_section = _section(data, "plan", where)
    _check_keys(plan_section, PLAN_KEYS, f"{where}: plan")
    plan = {k: _values(plan_section[k], k, where) if k in plan_section else PLAN_DEFAULTS[k] for k in PLAN_KEYS}
    cost = _section(data, "cost", where)
    _check_keys(cost, ("gpu_hour_usd",), f"{where}: cost")
    prices = {str(k): float(v) for k, v in _section(cost, "gpu_hour_usd", where).items()}
    for preset in hardware:
        prices.setdefault(str(preset), load_hardware(str(preset)).cost_per_gpu_hour)
    return ServingSpace(name=str(data.get("name", path.stem)), description=str(data.get("description", "")),
                        source=where, model=model, model_source=str(data["model"]), traffic=traffic, slo=slo,
                        hardware=tuple(str(h) for h in hardware), gpus=tuple(int(g) for g in gpus), hw_set=hw_set,
                        plan=plan, prices=prices, simulate=_count(data.get("simulate", 12), where))


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: simulate must be a whole number >= 0 (deployments to simulate), got {value!r}")
    return value
