"""Where the data files that ship with stageopt live: presets, search spaces, framework profiles, templates.

Why through :mod:`importlib.resources` and not ``Path(__file__).parents[n]``: in an
installed wheel the files sit inside the package (``stageopt/simulators/...``), in
an editable install they stay in the checkout's top-level ``simulators/`` and
``search_spaces/`` folders. ``setup.py`` maps those folders to the packages
``stageopt.simulators`` and ``stageopt.search_spaces`` (one copy of each file), and
the import system finds them the same way in both cases.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from stageopt.errors import ConfigError

SIMULATORS_PACKAGE = "stageopt.simulators"  # the checkout's simulators/: hardware/, frameworks/, astra-sim/
SPACES_PACKAGE = "stageopt.search_spaces"  # the checkout's search_spaces/
MODEL_PRESETS_PACKAGE = "stageopt.model"  # presets/ inside the package itself


def shipped_dir(package: str, *parts: str) -> Path:
    """The folder ``parts`` of a data package, as a path on disk (pip installs packages unpacked)."""
    try:
        root = files(package)
    except ModuleNotFoundError:
        raise ConfigError(f"stageopt's data package {package} is missing; install stageopt with pip "
                          "(pip install -e . in a checkout) instead of running it from a bare source tree") from None
    path = root.joinpath(*parts) if parts else root
    if not isinstance(path, Path):
        raise ConfigError(f"stageopt's data package {package} is not on disk ({path}); install stageopt unpacked "
                          "with pip, not as a zip")
    return path


def shipped_names(folder: Path, suffix: str = ".yaml") -> list[str]:
    """Names (without ``suffix``) of the shipped files in ``folder``, sorted."""
    return sorted(p.name.removesuffix(suffix) for p in folder.iterdir() if p.name.endswith(suffix))
