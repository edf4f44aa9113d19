"""Framework profiles by name (``simulators/frameworks/<name>.yaml``) or from a YAML file."""

from __future__ import annotations

import difflib
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
    if isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"framework file {text!r} not found; give an existing .yaml file or a profile name "
                              f"({', '.join(list_profiles())})")
        return from_mapping(FrameworkProfile, load_yaml_mapping(path), where=path.name)
    return _shipped(text)


@lru_cache(maxsize=16)
def _shipped(name: str) -> FrameworkProfile:
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        known = list_profiles()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"unknown framework {name!r}; {hint}known profiles: {', '.join(known)} "
                          f"(or pass a path to a .yaml file)")
    return from_mapping(FrameworkProfile, load_yaml_mapping(path), where=path.name)
