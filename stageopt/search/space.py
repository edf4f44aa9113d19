"""Search spaces: a YAML file says what to search; this module reads it into a typed, checked space.

Why a file and not flags: a search question (model, cluster, batch, which plan and
hardware dimensions, prices) is data that users copy and edit; strict reading
(unknown keys, wrong types and impossible values are one-line errors naming the
key) keeps a typo from silently searching the wrong space. The schema is
documented in ``search_spaces/README.md``.

Every dimension is suggested to Optuna over the same fixed range in every trial
(:meth:`~stageopt.search.dimensions.Dimension.suggest`), so samplers see a static space; choices
that do not fit together (divisibility) are decided later, by :mod:`stageopt.search.candidate`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from stageopt.errors import ConfigError
from stageopt.frameworks import load_profile
from stageopt.hardware import apply_hw_overrides, list_hardware_presets, load_hardware
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import MAX_COUNT, check_count, check_finite, check_gpus
from stageopt.inputs.names import check_plain_name
from stageopt.inputs.schema import load_yaml_mapping
from stageopt.inputs.shipped import SPACES_PACKAGE, shipped_dir, shipped_names
from stageopt.model import load_model
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import CP_COMMS, RECOMPUTE, SCHEDULES
from stageopt.search.dimensions import (
    BACKENDS,
    HW_DIMS,
    OBJECTIVES,
    PLAN_DEFAULTS,
    PLAN_DIMS,
    CostModel,
    Dimension,
    Value,
)

SPACES_DIR = shipped_dir(SPACES_PACKAGE)  # the checkout's search_spaces/, or stageopt/search_spaces/ in a wheel
DEFAULT_SPACE = "default"

_TOP_KEYS = ("name", "description", "model", "model_set", "framework", "cluster", "training", "plan", "codesign",
             "cost", "objectives", "backend", "screen")
_CLUSTER_KEYS = ("gpus", "hardware", "hw_set")
_TRAINING_KEYS = ("global_batch", "seq")
_COST_KEYS = ("gpu_hour_usd", "node_gpus_usd_per_gpu_hour", "scaleout_usd_per_gbps_per_gpu_hour",
              "hbm_usd_per_gib_per_gpu_hour")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """What one study searches: fixed model/batch, searched plan (and hardware) dimensions, objectives."""

    name: str
    description: str
    source: str
    model_source: str
    model_set: tuple[str, ...]
    model: ModelSpec
    gpus: tuple[int, ...]
    hardware: str
    hw_set: tuple[str, ...]
    gbs: int
    plan_dims: tuple[Dimension, ...]
    fixed_plan: Mapping[str, Value]
    hw_dims: tuple[Dimension, ...]
    cost: CostModel
    objectives: tuple[str, ...]
    backend: str
    screen: str | None
    framework: str | None = None  # the software stack every plan runs on (None: the default profile)

    @property
    def dims(self) -> tuple[Dimension, ...]:
        """Every searched dimension, in the order they are suggested."""
        gpus = (Dimension(name="gpus", values=self.gpus),) if len(self.gpus) > 1 else ()
        return gpus + self.hw_dims + self.plan_dims

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Value]:
        """Ask the trial for every dimension; returns the chosen values with fixed ones filled in."""
        return self.complete({d.name: d.suggest(trial) for d in self.dims})

    def decode(self, params: Mapping[str, Any]) -> dict[str, Value]:
        """The choices of a stored trial (inverse of :meth:`suggest`)."""
        return self.complete({d.name: d.decode(params) for d in self.dims})

    def complete(self, chosen: Mapping[str, Value]) -> dict[str, Value]:
        values: dict[str, Value] = {"gpus": self.gpus[0], **self.fixed_plan}
        values.update(chosen)
        return values

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {d.param: d.distribution() for d in self.dims}

    def size(self) -> int:
        n = 1
        for d in self.dims:
            n *= len(d.values)
        return n


# ----------------------------------------------------------------------------- loading


def encode_choices(space: SearchSpace, choices: Mapping[str, Any]) -> dict[str, Any]:
    """Optuna parameters (as the space suggests them) for a dict of dimension values."""
    return {d.param: d.encode(choices[d.name]) for d in space.dims}


def resolve_space_path(name_or_path: str | None) -> Path:
    """A shipped space by name (``default``, ``llama3-405b-cp``) or a YAML path."""
    text = name_or_path or DEFAULT_SPACE
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"--space {text!r}: file not found; give a .yaml file or one of "
                              f"{', '.join(list_spaces())}")
        return path
    path = SPACES_DIR / f"{text}.yaml"
    if not path.is_file():
        close = difflib.get_close_matches(text, list_spaces(), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"--space {text!r}: no such shipped space; {hint}known: {', '.join(list_spaces())}")
    return path


def list_spaces() -> list[str]:
    return shipped_names(SPACES_DIR)


def load_space(name_or_path: str | None = None) -> SearchSpace:
    """Read and check a search-space YAML file (see search_spaces/README.md)."""
    path = resolve_space_path(name_or_path)
    return space_from_dict(load_yaml_mapping(path), where=str(path))


def space_from_dict(data: Mapping[str, Any], where: str = "space") -> SearchSpace:
    _check_keys(data, _TOP_KEYS, where)
    for key in ("model", "cluster", "training", "plan"):
        if key not in data:
            raise ConfigError(f"{where}: missing '{key}' section; see search_spaces/README.md")
    model_set = tuple(_str_list(data.get("model_set", []), f"{where}: model_set"))
    cluster = _mapping(data["cluster"], f"{where}: cluster")
    training = _mapping(data["training"], f"{where}: training")
    _check_keys(cluster, _CLUSTER_KEYS, f"{where}: cluster")
    _check_keys(training, _TRAINING_KEYS, f"{where}: training")
    model_source = _text(data["model"], f"{where}: model")
    overrides = list(model_set) + ([f"seq={_pos_int(training['seq'], f'{where}: training.seq')}"]
                                   if "seq" in training else [])
    try:
        model = load_model(model_source, overrides)
    except ConfigError as err:
        raise ConfigError(f"{where}: model: {err}") from None
    gpus = tuple(_int_list(cluster.get("gpus"), f"{where}: cluster.gpus"))
    hardware = _text(cluster.get("hardware", "h100-sxm"), f"{where}: cluster.hardware")
    hw_set = tuple(_str_list(cluster.get("hw_set", []), f"{where}: cluster.hw_set"))
    if "global_batch" not in training:
        raise ConfigError(f"{where}: training.global_batch is missing; give the global batch in sequences")
    gbs = _pos_int(training["global_batch"], f"{where}: training.global_batch")
    plan_dims, fixed = _plan_dims(_mapping(data["plan"], f"{where}: plan"), where)
    hw_dims = _hw_dims(_mapping(data.get("codesign", {}), f"{where}: codesign"), where)
    base_presets = [hardware] + [str(v) for d in hw_dims if d.name == "hardware" for v in d.values]
    for preset in base_presets:
        try:
            apply_hw_overrides(load_hardware(preset), hw_set)
        except ConfigError as err:
            raise ConfigError(f"{where}: hardware {shorten(preset)}: {err}") from None
    objectives = tuple(_str_list(data.get("objectives", ["time"]), f"{where}: objectives"))
    check_objectives(objectives, where)
    backend = _text(data.get("backend", "analytical"), f"{where}: backend")
    if backend not in BACKENDS:
        raise ConfigError(f"{where}: backend {shorten(backend)} unknown; use one of {', '.join(BACKENDS)}")
    screen = data.get("screen")
    if screen is not None and screen != "analytical":
        raise ConfigError(f"{where}: screen {shorten(screen)} unknown; use 'analytical' or leave it out")
    return SearchSpace(
        name=_space_name(data, where),
        description=str(data.get("description", "")),
        source=where, model_source=model_source, model_set=model_set, model=model, gpus=gpus,
        hardware=hardware, hw_set=hw_set, gbs=gbs, plan_dims=plan_dims, fixed_plan=fixed, hw_dims=hw_dims,
        cost=_cost(_mapping(data.get("cost", {}), f"{where}: cost"), where), objectives=objectives,
        backend=backend, screen=screen, framework=_framework(data.get("framework"), where))


def _framework(value: Any, where: str) -> str | None:
    if value is None:
        return None
    name = _text(value, f"{where}: framework")
    try:
        load_profile(name)
    except ConfigError as err:
        raise ConfigError(f"{where}: framework: {err}") from None
    return name


def check_objectives(objectives: tuple[str, ...], where: str) -> None:
    if not objectives:
        raise ConfigError(f"{where}: objectives is empty; use e.g. time or time,cost")
    for name in objectives:
        if name not in OBJECTIVES:
            close = difflib.get_close_matches(name, OBJECTIVES, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"{where}: objective {shorten(name)} unknown; {hint}use {', '.join(OBJECTIVES)}")
    if len(set(objectives)) != len(objectives):
        raise ConfigError(f"{where}: objectives {list(objectives)} repeat a name; list each once")


def _plan_dims(section: Mapping[str, Any], where: str) -> tuple[tuple[Dimension, ...], dict[str, Value]]:
    _check_keys(section, PLAN_DIMS + ("dp",), f"{where}: plan")
    if "dp" in section:
        raise ConfigError(f"{where}: plan.dp is derived (gpus / (tp*cp*pp)); remove it")
    dims, fixed = [], dict(PLAN_DEFAULTS)
    for name in PLAN_DIMS:
        if name not in section:
            continue
        values = tuple(_plan_values(name, section[name], f"{where}: plan.{name}"))
        if len(values) == 1:
            fixed[name] = values[0]
        else:
            dims.append(Dimension(name=name, values=values))
            fixed.pop(name)
    return tuple(dims), fixed


def _plan_values(name: str, raw: Any, where: str) -> list[Value]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ConfigError(f"{where}: empty list; give at least one value")
    out: list[Value] = []
    for item in items:
        if name in ("sp", "embed_split", "loss_split"):
            if isinstance(item, str) and item.lower() in ("on", "off"):
                item = item.lower() == "on"
            if not isinstance(item, bool):
                raise ConfigError(f"{where}: {shorten(item)} is not on/off")
        elif name in ("first_layers", "last_layers"):
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= 10**6:
                raise ConfigError(f"{where}: {shorten(item)} is not a layer count in 0..1000000 (0: unset)")
        elif name == "cp_comm":
            if item not in CP_COMMS:
                raise ConfigError(f"{where}: {shorten(item)} is not one of {', '.join(CP_COMMS)}")
        elif name == "recompute":
            if item not in RECOMPUTE:
                raise ConfigError(f"{where}: {shorten(item)} is not one of {', '.join(RECOMPUTE)}")
        elif name == "schedule":
            if item not in SCHEDULES:
                raise ConfigError(f"{where}: {shorten(item)} is not one of {', '.join(SCHEDULES)}")
        elif name == "zero":
            if item not in (0, 1, 2, 3) or isinstance(item, bool):
                raise ConfigError(f"{where}: {shorten(item)} is not a ZeRO stage 0, 1, 2 or 3")
        else:
            item = _pos_int(item, where)
        if item in out:
            raise ConfigError(f"{where}: value {shorten(item)} is listed twice")
        out.append(item)
    return out


def _hw_dims(section: Mapping[str, Any], where: str) -> tuple[Dimension, ...]:
    _check_keys(section, HW_DIMS, f"{where}: codesign")
    dims = []
    for name in HW_DIMS:
        if name not in section:
            continue
        raw = section[name] if isinstance(section[name], list) else [section[name]]
        if name == "hardware":
            values: list[Value] = _str_list(raw, f"{where}: codesign.hardware")
            for preset in values:
                try:
                    load_hardware(str(preset))
                except ConfigError as err:
                    raise ConfigError(f"{where}: codesign.hardware: {err}") from None
        elif name == "node_gpus":
            values = [_pos_int(v, f"{where}: codesign.node_gpus") for v in raw]
        else:
            values = [_pos_float(v, f"{where}: codesign.{name}") for v in raw]
        if not values or len(set(values)) != len(values):
            raise ConfigError(f"{where}: codesign.{name} must list distinct values, got {shorten(raw)}")
        dims.append(Dimension(name=name, values=tuple(values)))
    return tuple(dims)


def _cost(section: Mapping[str, Any], where: str) -> CostModel:
    _check_keys(section, _COST_KEYS, f"{where}: cost")
    prices = _mapping(section.get("gpu_hour_usd", {}), f"{where}: cost.gpu_hour_usd")
    known = list_hardware_presets()
    for preset, price in prices.items():
        if str(preset) not in known and not str(preset).endswith((".yaml", ".yml")):
            raise ConfigError(f"{where}: cost.gpu_hour_usd: {shorten(preset)} is not a hardware preset ({', '.join(known)})")
        _pos_float(price, f"{where}: cost.gpu_hour_usd.{preset}")
    node = _mapping(section.get("node_gpus_usd_per_gpu_hour", {}), f"{where}: cost.node_gpus_usd_per_gpu_hour")
    return CostModel(
        gpu_hour_usd={str(k): float(v) for k, v in prices.items()},
        node_gpus_usd_per_gpu_hour={_pos_int(int(k) if str(k).isdigit() and len(str(k)) < 20 else k,
                                             f"{where}: cost.node_gpus_usd_per_gpu_hour"):
                                    _nonneg_float(v, f"{where}: cost.node_gpus_usd_per_gpu_hour.{k}")
                                    for k, v in node.items()},
        scaleout_usd_per_gbps_per_gpu_hour=_nonneg_float(section.get("scaleout_usd_per_gbps_per_gpu_hour", 0.0),
                                                         f"{where}: cost.scaleout_usd_per_gbps_per_gpu_hour"),
        hbm_usd_per_gib_per_gpu_hour=_nonneg_float(section.get("hbm_usd_per_gib_per_gpu_hour", 0.0),
                                                   f"{where}: cost.hbm_usd_per_gib_per_gpu_hour"))


# ----------------------------------------------------------------------------- small typed readers


def _check_keys(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown key {shorten(key)}; {hint}")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {shorten(value)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {shorten(value)}")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if isinstance(value, str) and "," in value:
        items = [v.strip() for v in value.split(",")]
    return [_text(v, where) for v in items]


def _space_name(data: Mapping[str, Any], where: str) -> str:
    """The study folder's stem: a given ``name:`` must be a plain name; the file's stem is made one."""
    if "name" in data:
        return check_plain_name(data["name"], f"{where}: name")
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(where).stem).lstrip("._-")
    return stem[:100] or "space"


def _pos_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {shorten(value)}")
    return check_count(value, where, low=1, high=MAX_COUNT, why="no count in a training space comes near it")


def _int_list(value: Any, where: str) -> list[int]:
    if value is None:
        raise ConfigError(f"{where}: missing; give a GPU count or a list of counts")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError(f"{where}: empty list; give at least one GPU count")
    out = [check_gpus(_pos_int(v, where), where) for v in items]
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}: GPU counts {shorten(out)} repeat a value")
    return out


def _pos_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: expected a positive number, got {shorten(value)}")
    return check_finite(value, where)


def _nonneg_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{where}: expected a number >= 0, got {shorten(value)}")
    return check_finite(value, where)
