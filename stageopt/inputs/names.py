"""Names that become file or folder names: confined to one path component.

Why: a space's ``name:`` becomes ``RUNS_DIR/<name>-<time>/`` and
``generate --prefix`` becomes ``OUT/<prefix>.<rank>.et``; ``../../x`` or
``/abs/path`` there would write outside the folder the user chose. One rule
for all of them: letters, digits, ``.``, ``_`` and ``-``, starting with a
letter or digit (so never ``..``, never a separator, never hidden).
"""

from __future__ import annotations

import re

from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_plain_name(name: object, where: str) -> str:
    """``name`` if it is one safe path component, else a ConfigError naming the rule."""
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name):
        raise ConfigError(f"{where} {shorten(name)}: use 1-100 letters, digits, '.', '_' or '-', starting with a "
                          "letter or digit (it names a file or folder, so no '/' and no '..')")
    return name
