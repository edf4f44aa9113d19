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
from stageopt.frameworks import FrameworkProfile, load_profile
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import check_gpus
from stageopt.inputs.names import check_plain_name
from stageopt.inputs.schema import load_yaml_mapping
from stageopt.inputs.shipped import SPACES_PACKAGE, shipped_dir, shipped_names
from stageopt.model import load_model
from stageopt.model.spec import ModelSpec
from stageopt.search.dimensions import (
    BACKENDS,
    OBJECTIVES,
    PLAN_DEFAULTS,
    PLAN_DIMS,
    CostModel,
    Dimension,
    Value,
    plan_value,
)
from stageopt.search.space_checks import check_plan_choices
from stageopt.search.space_hardware import Dim, cost_model, hw_dims
from stageopt.search.space_readers import (
    check_keys,
    int_list,
    mapping,
    nonneg_float,
    str_list,
    text,
)

SPACES_DIR = shipped_dir(SPACES_PACKAGE)  # the checkout's search_spaces/, or stageopt/search_spaces/ in a wheel
DEFAULT_SPACE = "default"

_TOP_KEYS = ("name", "description", "model", "model_set", "cluster", "training", "framework", "plan", "codesign",
             "cost", "objectives", "backend", "screen")
_CLUSTER_KEYS = ("gpus", "hardware", "hw_set", "reserve_gib")
_TRAINING_KEYS = ("global_batch", "seq")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """What one study searches: the plan part (plan fields, global batch, sequence length, framework)
    and the hardware part (GPU count, presets, any hardware field), with objectives and prices.

    ``plan_dims`` are enumerable; ``hw_dims`` may hold continuous :class:`Range` s, in which case
    the space is searched as an outer loop over hardware (see :mod:`stageopt.search.outer`).
    """

    name: str
    description: str
    source: str
    model_source: str
    model_set: tuple[str, ...]
    model: ModelSpec  # at the first sequence length; models_by_seq has the others
    models_by_seq: Mapping[int, ModelSpec]
    frameworks: Mapping[str, FrameworkProfile]
    gpus: tuple[int, ...]
    hardware: str
    hw_set: tuple[str, ...]
    reserve_gib: float | None
    gbs: int  # the first global batch (the only one unless training.global_batch is a list)
    plan_dims: tuple[Dimension, ...]
    fixed_plan: Mapping[str, Value]
    hw_dims: tuple[Dim, ...]
    cost: CostModel
    objectives: tuple[str, ...]
    backend: str
    screen: str | None

    @property
    def dims(self) -> tuple[Dim, ...]:
        """Every searched dimension, in the order they are suggested."""
        return self.hardware_dims + self.plan_dims

    @property
    def hardware_dims(self) -> tuple[Dim, ...]:
        """The hardware part: GPU count (when searched), presets and hardware fields."""
        gpus = (Dimension(name="gpus", values=self.gpus),) if len(self.gpus) > 1 else ()
        return gpus + self.hw_dims

    @property
    def enumerable(self) -> bool:
        """True when every dimension lists its values (no continuous range)."""
        return all(d.enumerable for d in self.dims)

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
        """Combinations of the enumerable dimensions (a range counts as one)."""
        n = 1
        for d in self.dims:
            n *= len(d.values) if d.enumerable else 1
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
    check_keys(data, _TOP_KEYS, where)
    for key in ("model", "cluster", "training", "plan"):
        if key not in data:
            raise ConfigError(f"{where}: missing '{key}' section; see search_spaces/README.md")
    model_set = tuple(str_list(data.get("model_set", []), f"{where}: model_set"))
    cluster = mapping(data["cluster"], f"{where}: cluster")
    training = mapping(data["training"], f"{where}: training")
    check_keys(cluster, _CLUSTER_KEYS, f"{where}: cluster")
    check_keys(training, _TRAINING_KEYS, f"{where}: training")
    model_source = text(data["model"], f"{where}: model")
    if "global_batch" not in training:
        raise ConfigError(f"{where}: training.global_batch is missing; give the global batch in sequences")
    gbs_values = int_list(training["global_batch"], f"{where}: training.global_batch", "global batch")
    seq_values = int_list(training["seq"], f"{where}: training.seq", "sequence length") if "seq" in training else []
    models = _models(model_source, model_set, seq_values, where)
    frameworks = _frameworks(data.get("framework"), where)
    gpus = tuple(check_gpus(g, f"{where}: cluster.gpus")
                 for g in int_list(cluster.get("gpus"), f"{where}: cluster.gpus", "GPU count"))
    hardware = text(cluster.get("hardware", "h100-sxm"), f"{where}: cluster.hardware")
    hw_set = tuple(str_list(cluster.get("hw_set", []), f"{where}: cluster.hw_set"))
    reserve = cluster.get("reserve_gib")
    reserve_gib = None if reserve is None else nonneg_float(reserve, f"{where}: cluster.reserve_gib")
    plan_dims, fixed = _plan_dims(mapping(data["plan"], f"{where}: plan"), where)
    plan_dims, fixed = _with_training(plan_dims, fixed, gbs_values, list(models), list(frameworks))
    first_model = next(iter(models.values()))
    check_plan_choices(plan_dims, fixed, first_model, frameworks, where)
    hardware_dims = hw_dims(mapping(data.get("codesign", {}), f"{where}: codesign"), hardware, hw_set, where)
    objectives = tuple(str_list(data.get("objectives", ["time"]), f"{where}: objectives"))
    check_objectives(objectives, where)
    backend = text(data.get("backend", "analytical"), f"{where}: backend")
    if backend not in BACKENDS:
        raise ConfigError(f"{where}: backend {shorten(backend)} unknown; use one of {', '.join(BACKENDS)}")
    screen = data.get("screen")
    if screen is not None and screen != "analytical":
        raise ConfigError(f"{where}: screen {shorten(screen)} unknown; use 'analytical' or leave it out")
    return SearchSpace(
        name=_space_name(data, where),
        description=str(data.get("description", "")), source=where, model_source=model_source,
        model_set=model_set, model=first_model, models_by_seq=models, frameworks=frameworks, gpus=gpus,
        hardware=hardware, hw_set=hw_set, reserve_gib=reserve_gib, gbs=gbs_values[0], plan_dims=plan_dims,
        fixed_plan=fixed, hw_dims=hardware_dims,
        cost=cost_model(mapping(data.get("cost", {}), f"{where}: cost"), where),
        objectives=objectives, backend=backend, screen=screen)


def _space_name(data: Mapping[str, Any], where: str) -> str:
    """The study folder's stem: a given ``name:`` must be a plain name; the file's stem is made one."""
    if "name" in data:
        return check_plain_name(data["name"], f"{where}: name")
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(where).stem).lstrip("._-")
    return stem[:100] or "space"


def _models(source: str, model_set: tuple[str, ...], seqs: list[int], where: str) -> dict[int, ModelSpec]:
    """The model at each searched sequence length (the model's own when training.seq is absent)."""
    out: dict[int, ModelSpec] = {}
    for seq in seqs or [None]:
        try:
            model = load_model(source, list(model_set) + ([f"seq={seq}"] if seq else []))
        except ConfigError as err:
            raise ConfigError(f"{where}: model: {err}") from None
        out[model.seq] = model
    return out


def _frameworks(raw: Any, where: str) -> dict[str, FrameworkProfile]:
    """Framework profiles by name: one (fixed) or several (searched); default megatron-core."""
    names = str_list(raw, f"{where}: framework") if raw is not None else [None]
    out: dict[str, FrameworkProfile] = {}
    for name in names:
        try:
            profile = load_profile(name)
        except ConfigError as err:
            raise ConfigError(f"{where}: framework: {err}") from None
        if (name or profile.name) in out:
            raise ConfigError(f"{where}: framework {shorten(name)} is listed twice")
        out[name or profile.name] = profile
    return out


def _with_training(dims: tuple[Dimension, ...], fixed: dict[str, Value], gbs: list[int], seqs: list[int],
                   frameworks: list[str]) -> tuple[tuple[Dimension, ...], dict[str, Value]]:
    """Global batch, sequence length and framework join the plan part: searched when listed, else fixed."""
    out, fixed = list(dims), dict(fixed)
    for name, values in (("gbs", gbs), ("seq", seqs), ("framework", frameworks)):
        if len(values) > 1:
            out.append(Dimension(name=name, values=tuple(values)))
        else:
            fixed[name] = values[0]
    return tuple(out), fixed


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
    if "dp" in section:
        raise ConfigError(f"{where}: plan.dp is derived (gpus / (tp*cp*pp)); remove it")
    for key, name in (("gbs", "global_batch"), ("seq", "seq"), ("framework", "framework")):
        if key in section:
            where_to = "the top-level 'framework' key" if key == "framework" else f"training.{name}"
            raise ConfigError(f"{where}: plan.{key} belongs in {where_to}; move it there")
    check_keys(section, PLAN_DIMS, f"{where}: plan")
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
        value = plan_value(name, item, where)
        if value in out:
            raise ConfigError(f"{where}: value {shorten(item)} is listed twice")
        out.append(value)
    return out
