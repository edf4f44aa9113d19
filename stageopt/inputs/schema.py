"""Strict conversion between plain mappings (YAML) and frozen config dataclasses.

Why its own module: hardware presets are user-edited data, and a misspelt key
that is silently ignored gives a plausible but wrong simulation. Every key is
checked against the dataclass fields (unknown and missing keys are errors), every
value against the field's annotation, and every range rule declared in the
field's metadata. The same type rules parse ``--hw-set key=value`` strings, so
an override cannot smuggle in a value a file could not.

Supported annotations: ``float``, ``int``, ``str``, ``bool``, ``Literal[...]``,
nested dataclasses, and ``X | None``. Range rules live in field metadata:
``gt``/``ge``/``le`` bounds (see :func:`check_fields`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from stageopt.errors import ConfigError
from stageopt.inputs.gate import load_yaml_mapping, shorten
from stageopt.inputs.limits import MAX_CONFIG_NUMBER, check_finite

__all__ = ["bounds", "check_fields", "field_paths", "from_mapping", "is_group", "load_yaml_mapping", "parse_text",
           "replace_path"]

T = TypeVar("T")

_NONE_WORDS = ("none", "null", "~")


def bounds(*, gt: float | None = None, ge: float | None = None, le: float | None = None,
           doc: str = "") -> dict[str, Any]:
    """Field metadata declaring a numeric range (used as ``field(metadata=bounds(gt=0))``)."""
    return {"gt": gt, "ge": ge, "le": le, "doc": doc}


def check_fields(obj: object) -> None:
    """Enforce the ``bounds`` metadata of every field of a dataclass instance.

    Called from each config class's ``__post_init__`` so that objects built in
    Python are as valid as those loaded from YAML.
    """
    cls_name = type(obj).__name__
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{cls_name}.{f.name} = {shorten(value)} is not finite; give a finite number")
        gt, ge, le = f.metadata.get("gt"), f.metadata.get("ge"), f.metadata.get("le")
        if gt is not None and not value > gt:
            raise ConfigError(f"{cls_name}.{f.name} = {shorten(value)} must be > {gt:g}; give a value above {gt:g}")
        if ge is not None and not value >= ge:
            raise ConfigError(f"{cls_name}.{f.name} = {shorten(value)} must be >= {ge:g}; give a value of at least {ge:g}")
        if le is not None and not value <= le:
            raise ConfigError(f"{cls_name}.{f.name} = {shorten(value)} must be <= {le:g}; give a value of at most {le:g}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=False)


def _optional_inner(tp: Any) -> Any | None:
    """Return X for ``X | None``; None when ``tp`` is not optional."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0]
    return None


def _type_name(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_type_name(inner)} or null"
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp: Any, value: object, where: str) -> object:
    """Check (and for nested mappings, build) ``value`` against annotation ``tp``."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _coerce(inner, value, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} = {shorten(value)} must be {_type_name(tp)} with keys "
                              f"{', '.join(f.name for f in dataclasses.fields(tp))}")
        return from_mapping(tp, value, where)  # type: ignore[arg-type]
    if get_origin(tp) is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where} = {shorten(value)} must be {_type_name(tp)}")
        return value
    if get_origin(tp) is tuple:  # tuple[X, ...]: a YAML list of X
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} = {shorten(value)} must be {_type_name(tp)}")
        return tuple(_coerce(get_args(tp)[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {shorten(value)} must be true or false")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = " (YAML reads 1e3 as text: write 1.0e3 or 1000)" if isinstance(value, str) else ""
            raise ConfigError(f"{where} = {shorten(value)} is not a number; give a number{hint}")
        return check_finite(value, where)
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} = {shorten(value)} is not an integer; give a whole number")
        check_finite(value, where, high=MAX_CONFIG_NUMBER)
        return value
    if tp is str:
        if not isinstance(value, str):
            hint = " (YAML reads an unquoted 2.10 as the number 2.1)" if isinstance(value, float) else ""
            raise ConfigError(f"{where} = {shorten(value)} must be text; put it in quotes{hint}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {where}")  # a bug in a config class


def _valid_keys(names: list[str], room: int = 220) -> str:
    """The valid keys, as many as a one-line error has room for."""
    text = ", ".join(names)
    if len(text) <= room:
        return f"valid keys: {text}"
    shown = text[:room].rsplit(", ", 1)[0]
    return f"valid keys: {shown}, ... ({len(names)} in all; the shipped files under simulators/ show them)"


def from_mapping(cls: type[T], data: Mapping[str, object], where: str) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown, missing or mistyped keys.

    ``where`` prefixes every message (e.g. ``"h100-sxm.yaml: node"``) so the user
    sees which entry of which file is wrong.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = _hints(cls)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            fix = f"did you mean '{close[0]}'?" if close else _valid_keys(list(fields))
            raise ConfigError(f"{where}: unknown key {shorten(key)}; {fix}")
    missing = [name for name in required_keys(cls) if name not in data]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}; add them "
                          f"(the shipped files under simulators/ are examples)")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def is_group(tp: Any) -> bool:
    """True when annotation ``tp`` is a nested config (a dataclass, optional or not)."""
    return dataclasses.is_dataclass(_optional_inner(tp) or tp)


def required_keys(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` that have no default: a mapping for it must give each."""
    return [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def group_class(tp: Any) -> Any:
    """The dataclass a group annotation holds (``X`` for ``X | None``)."""
    return _optional_inner(tp) or tp


def field_paths(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted_path, annotation)`` for every field, nested ones included."""
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = _hints(cls)[f.name]
        path = f"{prefix}{f.name}"
        yield path, tp
        target = _optional_inner(tp) or tp
        if dataclasses.is_dataclass(target):
            yield from field_paths(target, path + ".")  # type: ignore[arg-type]


def parse_text(tp: Any, text: str, where: str) -> object:
    """Parse an override string as annotation ``tp`` (``"1e3"`` is a float here)."""
    raw = text.strip()
    inner = _optional_inner(tp)
    if inner is not None:
        return None if raw.lower() in _NONE_WORDS else parse_text(inner, raw, where)
    if tp is float or tp is int:
        try:
            number = float(raw) if tp is float else int(raw)
        except (ValueError, OverflowError):
            try:
                number = float(raw)
            except ValueError:
                raise ConfigError(f"{where} = {shorten(raw)} is not a number; give e.g. {where}=100") from None
        return _coerce(tp, number, where)
    if tp is bool:
        lowered = raw.lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ConfigError(f"{where} = {shorten(raw)} must be true or false")
        return lowered in ("true", "1", "yes", "on")
    return _coerce(tp, raw, where)


def replace_path(obj: T, path: list[str], value: object) -> T:
    """Return a copy of nested dataclass ``obj`` with the field at ``path`` replaced.

    Goes through ``dataclasses.replace`` at every level, so each class's
    ``__post_init__`` validation runs on the new value.
    """
    head, rest = path[0], path[1:]
    new = value if not rest else replace_path(getattr(obj, head), rest, value)
    return dataclasses.replace(obj, **{head: new})  # type: ignore[type-var]
