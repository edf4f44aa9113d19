"""A hardware file with calibrated values: the base file's contents, the fitted fields set, a header saying how.

Why a whole file rather than a list of overrides: every command takes
``--hardware FILE`` (and a search space names its hardware), so a calibrated
cluster is used the way a preset is, and the header keeps the record of what
was fitted to which measurements beside the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from stageopt.hardware import Hardware, load_hardware
from stageopt.hardware.presets import hardware_from_dict, hardware_path
from stageopt.inputs.gate import load_yaml_mapping


def write_calibrated_hardware(base: str, hw_set: Sequence[str], path: Path, header: Sequence[str],
                              accuracy: Mapping[str, object] | None = None) -> Hardware:
    """Write ``base`` (a preset name or YAML path) with ``hw_set`` applied to ``path``; return it as loaded.

    ``accuracy``: the new fit's own record (:class:`stageopt.hardware.machine.Accuracy` fields); the base
    preset's record describes another fit, so it never carries over.
    """
    data = _plain(load_yaml_mapping(hardware_path(base)))
    for item in hw_set:
        key, _, value = item.partition("=")
        _set(data, key.split("."), yaml.safe_load(value))
    data.pop("accuracy", None)
    if accuracy is not None:  # for this machine alone: its fingerprint goes with the figures
        data["accuracy"] = {"machine": hardware_from_dict(data).fingerprint(), **accuracy}
    data["name"] = path.stem
    data["description"] = f"{data.get('description', base)}; calibrated to measured runs"
    comments = "".join(f"# {line}\n" for line in header)
    path.write_text(comments + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    return load_hardware(path)


def _plain(value):
    """Nested mappings as plain dicts (the loader may return read-only mappings)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _set(data: dict, parts: list[str], value) -> None:
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value
