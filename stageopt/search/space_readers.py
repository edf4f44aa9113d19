"""Small typed readers for search-space YAML: each names the key and the fix in a one-line ConfigError."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import MAX_COUNT, check_count, check_finite


def check_keys(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            listed = ", ".join(map(str, allowed))
            fix = (f"did you mean '{close[0]}'?" if close else
                   f"allowed: {listed}" if len(listed) < 160 else "search_spaces/README.md lists the allowed keys")
            raise ConfigError(f"{where}: unknown key {shorten(key)}; {fix}")


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {shorten(value)}")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {shorten(value)}")
    return value


def str_list(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if isinstance(value, str) and "," in value:
        items = [v.strip() for v in value.split(",")]
    return [text(v, where) for v in items]


def pos_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {shorten(value)}")
    return check_count(value, where, low=1, high=MAX_COUNT, why="no count in a training space comes near it")


def int_list(value: Any, where: str, what: str) -> list[int]:
    if value is None:
        raise ConfigError(f"{where}: missing; give a {what} or a list of them")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError(f"{where}: empty list; give at least one {what}")
    out = [pos_int(v, where) for v in items]
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}: {shorten(out)} repeats a value")
    return out


def pos_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: expected a positive number, got {shorten(value)}")
    return check_finite(value, where)


def nonneg_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{where}: expected a number >= 0, got {shorten(value)}")
    return check_finite(value, where)
