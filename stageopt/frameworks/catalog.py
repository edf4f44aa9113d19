"""Framework profiles by name (``simulators/frameworks/<name>.yaml``) or from a YAML file.

A profile may name another as its ``base`` (a shipped name or a .yaml path, relative to the file
naming it) and set only what differs: a dated release of a stack, or a custom stack that changes a
few defaults of a shipped one (``base: megatron-core`` plus the keys that differ).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from stageopt.errors import ConfigError
from stageopt.frameworks.profile import FrameworkProfile
from stageopt.inputs.schema import from_mapping, load_yaml_mapping
from stageopt.inputs.shipped import SIMULATORS_PACKAGE, shipped_dir, shipped_names

PROFILES_DIR = shipped_dir(SIMULATORS_PACKAGE, "frameworks")
DEFAULT_FRAMEWORK = "megatron-core"


def list_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return shipped_names(PROFILES_DIR)


def load_profile(name_or_path: str | Path | None = None) -> FrameworkProfile:
    """A shipped profile by name, a YAML file by path, or the default (``megatron-core``)."""
    text = DEFAULT_FRAMEWORK if name_or_path is None else str(name_or_path)
    if isinstance(name_or_path, Path) or _is_file(text):
        path = _user_file(Path(text).expanduser())
        return from_mapping(FrameworkProfile, _resolved(path, ()), where=path.name)
    return _shipped(text)


def _is_file(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or "/" in text


def _user_file(path: Path) -> Path:
    if not path.is_file():
        raise ConfigError(f"framework file {str(path)!r} not found; give an existing .yaml file or a profile name "
                          f"({', '.join(list_profiles())})")
    return path


def _shipped_file(name: str) -> Path:
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        known = list_profiles()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"unknown framework {name!r}; {hint}known profiles: {', '.join(known)} "
                          f"(or pass a path to a .yaml file)")
    return path


def _resolved(path: Path, chain: tuple[Path, ...]) -> Mapping[str, object]:
    """The profile file's keys over those of its ``base`` chain."""
    if path.resolve() in chain:
        names = " -> ".join(p.name for p in (*chain, path.resolve()))
        raise ConfigError(f"{path.name}: 'base' runs in a circle ({names}); make one profile stand alone")
    own = load_yaml_mapping(path)
    base = own.get("base")
    if base is None:
        return own
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path.name}: 'base' must be a profile name or a .yaml path, got {base!r}")
    parent = _user_file(path.parent / base) if _is_file(base) else _shipped_file(base)
    return {**_resolved(parent, (*chain, path.resolve())), **{k: v for k, v in own.items() if k != "base"}}


@lru_cache(maxsize=16)
def _shipped(name: str) -> FrameworkProfile:
    path = _shipped_file(name)
    return from_mapping(FrameworkProfile, _resolved(path, ()), where=path.name)
