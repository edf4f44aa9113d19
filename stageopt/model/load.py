"""Turn what a user typed after ``--model`` (and ``--set``) into a ModelSpec.

Accepted: a preset name (``stageopt presets``), a YAML file with ModelSpec
fields, or a Hugging Face ``config.json`` (Llama, Mistral, Mixtral, GPT-2 style).
"""

from __future__ import annotations

import math

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from stageopt.errors import ConfigError
from stageopt.model.spec import ModelSpec

PRESET_DIR = Path(__file__).resolve().parent / "presets"
_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}


def list_model_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_model(source: str, overrides: list[str] | tuple[str, ...] = ()) -> ModelSpec:
    """Load a preset, YAML or HF config, then apply ``key=value`` overrides."""
    fields = _read_source(source)
    fields.update(parse_overrides(overrides))
    return spec_from_dict(fields, origin=source)


def spec_from_dict(fields: dict[str, Any], origin: str = "model") -> ModelSpec:
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        key = unknown[0]
        hint = difflib.get_close_matches(key, list(_FIELDS), n=1)
        fix = f"did you mean '{hint[0]}'?" if hint else f"known fields: {', '.join(_FIELDS)}"
        raise ConfigError(f"{origin}: unknown model field '{key}'; {fix}")
    missing = [n for n, f in _FIELDS.items()
               if f.default is dataclasses.MISSING and n not in fields]
    if missing:
        raise ConfigError(f"{origin}: missing model field '{missing[0]}'; add '{missing[0]}: <value>'")
    try:
        return ModelSpec(**fields)
    except TypeError as err:
        raise ConfigError(f"{origin}: {err}") from None


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse ``--set key=value`` items, typing each value like the field it sets."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set '{item}' is not key=value; write e.g. --set layers=32")
        if key not in _FIELDS:
            hint = difflib.get_close_matches(key, list(_FIELDS), n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else "see 'stageopt presets --fields'"
            raise ConfigError(f"--set {key}: unknown model field; {fix}")
        out[key] = _coerce(key, raw.strip())
    return out


def _coerce(key: str, raw: str) -> Any:
    kind = _FIELDS[key].type
    if kind in ("int", int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"--set {key}={raw}: expected an integer") from None
    if kind in ("bool", bool):
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--set {key}={raw}: expected true or false")
    if kind in ("float", float):
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"--set {key}={raw}: expected a number") from None
        if not math.isfinite(value):
            raise ConfigError(f"--set {key}={raw}: expected a finite number")
        return value
    return raw


def _read_source(source: str) -> dict[str, Any]:
    path = Path(source)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.is_file():
            raise ConfigError(f"--model {source}: no such file; give a preset "
                              f"({', '.join(list_model_presets())}) or a YAML/config.json path")
        return _read_file(path)
    preset = PRESET_DIR / f"{source}.yaml"
    if not preset.is_file():
        hint = difflib.get_close_matches(source, list_model_presets(), n=1)
        fix = f"did you mean '{hint[0]}'? " if hint else ""
        raise ConfigError(f"--model {source}: unknown preset; {fix}known presets: {', '.join(list_model_presets())}"
                          " (or give a YAML / config.json path)")
    fields = _read_file(preset)
    fields.setdefault("name", source)
    return fields


def _read_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        first = str(err).splitlines()[0]
        raise ConfigError(f"{path}: malformed {'JSON' if path.suffix == '.json' else 'YAML'} ({first})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of model fields, got {type(data).__name__}")
    if "model_type" in data or "architectures" in data:
        return from_hf_config(data, origin=str(path))
    data.setdefault("name", path.stem)
    return data


def from_hf_config(cfg: dict[str, Any], origin: str = "config.json") -> dict[str, Any]:
    """Map a Hugging Face transformers config to ModelSpec fields."""
    kind = str(cfg.get("model_type", "")).lower()
    try:
        if kind in ("llama", "mistral", "mixtral", "qwen2"):
            heads = int(cfg["num_attention_heads"])
            fields: dict[str, Any] = {
                "name": cfg.get("_name_or_path") or kind,
                "family": "llama",
                "layers": int(cfg["num_hidden_layers"]),
                "hidden": int(cfg["hidden_size"]),
                "heads": heads,
                "kv_heads": int(cfg.get("num_key_value_heads") or heads),
                "ffn": int(cfg["intermediate_size"]),
                "vocab": int(cfg["vocab_size"]),
                "seq": int(cfg.get("max_position_embeddings", 4096)),
                "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            }
            if cfg.get("head_dim"):
                fields["head_dim"] = int(cfg["head_dim"])
            if kind == "mixtral":
                fields.update(family="moe", experts=int(cfg["num_local_experts"]),
                              top_k=int(cfg["num_experts_per_tok"]), expert_ffn=int(cfg["intermediate_size"]))
            return fields
        if kind == "gpt2":
            hidden = int(cfg["n_embd"])
            return {"name": "gpt2", "family": "gpt", "layers": int(cfg["n_layer"]), "hidden": hidden,
                    "heads": int(cfg["n_head"]), "kv_heads": int(cfg["n_head"]),
                    "ffn": int(cfg.get("n_inner") or 4 * hidden), "vocab": int(cfg["vocab_size"]),
                    "seq": int(cfg["n_positions"]), "norm": "layernorm", "activation": "gelu",
                    "position": "learned", "tied_embeddings": True, "bias": True, "dropout": True}
    except KeyError as err:
        raise ConfigError(f"{origin}: Hugging Face config lacks {err.args[0]!r}") from None
    raise ConfigError(f"{origin}: unsupported Hugging Face model_type {kind!r}; "
                      "supported: llama, mistral, mixtral, qwen2, gpt2 (or write a stageopt YAML)")
