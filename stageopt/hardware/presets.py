"""Hardware presets (YAML in ``simulators/hardware/``) and ``--hw-set`` overrides.

Why apart from the spec: loading knows about files and user-facing messages;
the spec classes only validate values. Every override re-validates the whole
object, so a co-design study cannot build a machine the schema would reject.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path

from stageopt.errors import ConfigError
from stageopt.hardware.machine import Hardware
from stageopt.inputs.schema import (field_paths, from_mapping, group_class, is_group, load_yaml_mapping, parse_text,
                                    replace_path, required_keys)
from stageopt.inputs.shipped import SIMULATORS_PACKAGE, shipped_dir, shipped_names

SIMULATORS_DIR = shipped_dir(SIMULATORS_PACKAGE)  # the checkout's simulators/, or stageopt/simulators/ in a wheel
PRESETS_DIR = SIMULATORS_DIR / "hardware"
RECORD = "accuracy"  # Hardware's validation record: data about a fit, not a knob --hw-set may turn

def list_hardware_presets() -> list[str]:
    """Names of the YAML presets shipped in ``simulators/hardware/``."""
    return shipped_names(PRESETS_DIR)


def hardware_from_dict(data: Mapping[str, object], where: str = "hardware") -> Hardware:
    """Build a :class:`Hardware` from a parsed mapping, strictly (see :mod:`stageopt.inputs.schema`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of hardware keys, got {type(data).__name__}")
    return from_mapping(Hardware, data, where)


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Load a preset by name (``h100-sxm``) or a YAML file by path."""
    path = hardware_path(name_or_path)
    return hardware_from_dict(load_yaml_mapping(path), where=path.name)


def hardware_path(name_or_path: str | Path) -> Path:
    """The YAML file behind a preset name or a path; a one-line error naming the known presets otherwise."""
    text = str(name_or_path)
    is_file = isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text
    if is_file:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"hardware file {text!r} not found; give an existing .yaml file or a preset name "
                              f"({', '.join(list_hardware_presets())})")
    else:
        path = PRESETS_DIR / f"{text}.yaml"
        if not path.is_file():
            known = list_hardware_presets()
            close = difflib.get_close_matches(text, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"unknown hardware preset {text!r}; {hint}known presets: {', '.join(known)} "
                              f"(or pass a path to a .yaml file)")
    return path


def hw_override_keys() -> list[str]:
    """Every dotted key ``--hw-set`` accepts (scalars, plus ``gpu.peak_tflops``)."""
    keys = [p for p, tp in field_paths(Hardware) if not is_group(tp) and not p.startswith(RECORD + ".")]
    return sorted(keys + ["gpu.peak_tflops"])


def apply_hw_overrides(hw: Hardware, overrides: Iterable[str]) -> Hardware:
    """Return ``hw`` with each ``"dotted.key=value"`` applied, left to right.

    Any scalar field is settable by its dotted path (``node.bandwidth_gbps=900``,
    ``gpu.efficiency.matmul.peak_fraction=0.7``, ``gpu.peak_tflops.fp8=2000``).
    ``gpu.peak_tflops=X`` sets the bf16 peak to X and scales every other dtype
    by the same factor. Each result is re-validated.
    """
    paths = dict(field_paths(Hardware))
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--hw-set {item!r} is not key=value; write e.g. --hw-set node.bandwidth_gbps=900")
        if key == "gpu.peak_tflops":
            target = float(parse_text(float, raw, key))  # type: ignore[arg-type]
            try:
                hw = replace_path(hw, ["gpu", "peak_tflops"], hw.gpu.peak_tflops.scaled(target / hw.gpu.peak_tflops.bf16))
            except ConfigError as err:
                raise ConfigError(f"--hw-set {item}: {err}") from None
            continue
        if key.split(".")[0] == RECORD:
            raise ConfigError(f"--hw-set key '{key}': the accuracy record states how the preset's fit did on "
                              "published runs, not a property of the machine; it cannot be set (stageopt calibrate "
                              "writes one for your own runs)")
        if key not in paths:
            close = difflib.get_close_matches(key, hw_override_keys(), n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else "see stageopt.hardware.hw_override_keys()"
            raise ConfigError(f"--hw-set key '{key}' is not a hardware field; {hint}")
        tp = paths[key]
        if is_group(tp):
            subkeys = [k for k in hw_override_keys() if k.startswith(key + ".")]
            raise ConfigError(f"--hw-set key '{key}' is a group, not a value; set one of {', '.join(subkeys)}")
        value = parse_text(tp, raw, key)
        try:
            hw = _replace_creating(hw, key.split("."), value)
        except ConfigError as err:
            raise ConfigError(f"--hw-set {item}: {err}") from None
    return hw


def _replace_creating(hw: Hardware, path: list[str], value: object) -> Hardware:
    """replace_path, except that an absent optional group (``interpod``, ``nccl``) cannot be half-set: its
    required keys come together, from a YAML section."""
    group = path[0]
    if len(path) > 1 and getattr(hw, group) is None:
        needed = ", ".join(required_keys(group_class(dict(field_paths(Hardware))[group])))
        raise ConfigError(f"{group} is not defined in this hardware; add a '{group}:' section to a YAML "
                          f"file ({needed}) instead of setting one field")
    return replace_path(hw, path, value)


def ranking_accuracy(hardware: str) -> str:
    """What a search record's hardware (``"preset [key=value ...]"``) preset's validation says of its figures
    and of picking between plans."""
    preset, *overrides = hardware.split()
    hw = apply_hw_overrides(load_hardware(preset), overrides)
    record = hw.measured_accuracy
    return f"{hw.name}: {record.describe_ranking()}" if record else f"{hw.name}: {hw.accuracy_unknown()}"
