"""Turn what a user typed after ``--model`` (and ``--set``) into a ModelSpec.

Accepted: a preset name (``stageopt presets``), a YAML file with ModelSpec
fields, or a Hugging Face ``config.json`` (Llama, Mistral, Mixtral, Qwen2, Qwen3,
Qwen2-MoE, Qwen3-MoE, GPT-2, DeepSeek-V2/V3 style).

A ``config.json`` describes the model, not its training: its
``max_position_embeddings`` is the longest context it supports (131,072 for
Llama 3.1), not the sequence length it is trained at. The training sequence
length of an imported config is therefore :data:`HF_DEFAULT_SEQ` (or the
config's limit when that is shorter), and the assumption is logged on the
``stageopt`` logger, which the command line prints as a note.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
from pathlib import Path
from typing import Any

from stageopt.errors import ConfigError
from stageopt.inputs.gate import clip, load_document, shorten
from stageopt.inputs.limits import MODEL_BOUNDS
from stageopt.inputs.shipped import MODEL_PRESETS_PACKAGE, shipped_dir, shipped_names
from stageopt.model.hf_deepseek import DEEPSEEK_TYPES, deepseek_fields
from stageopt.model.hf_hybrid import HYBRID_TYPES, hybrid_fields
from stageopt.model.hf_parallel import PARALLEL_TYPES, parallel_fields
from stageopt.model.spec import ModelSpec

PRESET_DIR = shipped_dir(MODEL_PRESETS_PACKAGE, "presets")
HF_DEFAULT_SEQ = 4096  # training sequence length assumed for a Hugging Face config; --set seq=N changes it
_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}
_ASSUMED = "_assumed"  # key of {field: reason} in what a reader returns, popped before ModelSpec sees it
_log = logging.getLogger(__name__)


def list_model_presets() -> list[str]:
    return shipped_names(PRESET_DIR)


def load_model(source: str, overrides: list[str] | tuple[str, ...] = ()) -> ModelSpec:
    """Load a preset, YAML or HF config, then apply ``key=value`` overrides.

    A value the source did not state (an imported config's training ``seq``) and
    no override set is logged as an assumption.
    """
    fields = _read_source(source)
    given = parse_overrides(overrides)
    assumed = fields.pop(_ASSUMED, {})
    fields.update(given)
    spec = spec_from_dict(fields, origin=source)  # a model that fails validation gets its error alone, no note
    for key, why in assumed.items():
        if key not in given:
            _log.info("%s: %s=%s assumed (%s); change it with --set %s=N", source, key, fields[key], why, key)
    return spec


def spec_from_dict(fields: dict[str, Any], origin: str = "model") -> ModelSpec:
    odd = [k for k in fields if not isinstance(k, str)]
    if odd:
        raise ConfigError(f"{origin}: model field names must be text, got {shorten(odd[0])}; "
                          f"write 'name: value' lines")
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        key = unknown[0]
        hint = difflib.get_close_matches(key, list(_FIELDS), n=1)
        fix = f"did you mean '{hint[0]}'?" if hint else "'stageopt presets --fields' lists the known ones"
        raise ConfigError(f"{origin}: unknown model field {shorten(key)}; {fix}")
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
            raise ConfigError(f"--set '{clip(item)}' is not key=value; write e.g. --set layers=32")
        if key not in _FIELDS:
            hint = difflib.get_close_matches(key, list(_FIELDS), n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else "'stageopt presets --fields' lists them"
            raise ConfigError(f"--set {clip(key)}: unknown model field; {fix}")
        out[key] = _coerce(key, raw.strip())
    return out


def _coerce(key: str, raw: str) -> Any:
    kind = _FIELDS[key].type
    if kind in ("int", int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"--set {key}={clip(raw)}: expected an integer") from None
    if kind in ("bool", bool):
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--set {key}={clip(raw)}: expected true or false")
    if kind in ("float", float):
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"--set {key}={clip(raw)}: expected a number") from None
        if not math.isfinite(value):
            raise ConfigError(f"--set {key}={clip(raw)}: expected a finite number")
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
    data = load_document(path, "model file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of model fields, got {type(data).__name__}")
    if "model_type" in data or "architectures" in data:
        return from_hf_config(data, origin=str(path))
    data.setdefault("name", path.stem)
    return data


_REQUIRED = object()


def _hf_int(cfg: dict[str, Any], key: str, origin: str, default: Any = _REQUIRED) -> int:
    """An integer field of a Hugging Face config; a missing, null, text or fractional value is named."""
    if key not in cfg or (cfg[key] is None and default is not _REQUIRED):
        if default is _REQUIRED:
            raise ConfigError(f"{origin}: Hugging Face config lacks {key!r}; add it (an integer)")
        return default
    value = cfg[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{origin}: Hugging Face config field {key!r} = {shorten(value)} is not an integer; "
                          "give a whole number")
    return value


def _hf_bool(cfg: dict[str, Any], key: str, origin: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{origin}: Hugging Face config field {key!r} = {shorten(value)} must be true or false")
    return value


def from_hf_config(cfg: dict[str, Any], origin: str = "config.json") -> dict[str, Any]:
    """Map a Hugging Face transformers config to ModelSpec fields (every value type-checked), plus the
    assumptions made (the training ``seq``)."""
    fields = _architecture_fields(cfg, origin)
    mscale = _yarn_mscale(cfg.get("rope_scaling"), origin)
    return {**fields, "rope_mscale": mscale} if mscale != 1 else fields


def _yarn_mscale(scaling: Any, origin: str) -> float:
    """YaRN's attention scaling of the rotary tables, as Megatron-Core derives it from a config's ``rope_scaling``
    (``_yarn_get_concentration_factor``): ``attention_factor`` when given, else mscale / mscale_all_dim when
    both are given, else 0.1 ln(factor) + 1. 1 for any other (or no) scaling."""
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return 1.0
    for key in ("factor", "attention_factor", "mscale", "mscale_all_dim"):
        value = scaling.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"{origin}: rope_scaling.{key} = {shorten(value)} must be a positive number")
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling.get("factor") or 1.0)

    def yarn_mscale(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0

    if scaling.get("mscale") is None or scaling.get("mscale_all_dim") is None:
        return yarn_mscale(1.0)
    return yarn_mscale(scaling["mscale"]) / yarn_mscale(scaling["mscale_all_dim"])


def _architecture_fields(cfg: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields of the model type's family reader."""
    kind = cfg.get("model_type", "")
    kind = kind.lower() if isinstance(kind, str) else shorten(kind)
    named = cfg.get("_name_or_path")
    if kind in _LLAMA_LIKE:
        heads = _hf_int(cfg, "num_attention_heads", origin)
        fields: dict[str, Any] = {
            "name": named if isinstance(named, str) and named else kind,
            "family": "llama",
            "layers": _hf_int(cfg, "num_hidden_layers", origin),
            "hidden": _hf_int(cfg, "hidden_size", origin),
            "heads": heads,
            "kv_heads": _hf_int(cfg, "num_key_value_heads", origin, heads),
            "ffn": _hf_int(cfg, "intermediate_size", origin),
            "vocab": _hf_int(cfg, "vocab_size", origin),
            "tied_embeddings": _hf_bool(cfg, "tie_word_embeddings", origin, kind in _TIED_BY_DEFAULT),
            **_training_seq(_hf_int(cfg, "max_position_embeddings", origin, None), "max_position_embeddings", origin),
        }
        head_dim = _hf_int(cfg, "head_dim", origin, 0)
        if head_dim:
            fields["head_dim"] = head_dim
        if kind == "mixtral":
            fields.update(family="moe", experts=_hf_int(cfg, "num_local_experts", origin),
                          top_k=_hf_int(cfg, "num_experts_per_tok", origin), expert_ffn=fields["ffn"])
        if kind in ("qwen2_moe", "qwen3_moe"):
            fields.update(_qwen_moe(cfg, fields["layers"], origin))
        if kind in _QK_NORM:
            fields["qk_norm"] = True
        return fields
    if kind in DEEPSEEK_TYPES:
        return _families(deepseek_fields, cfg, origin)
    if kind in HYBRID_TYPES:
        if kind == "gemma3" and isinstance(cfg.get("text_config"), dict):  # multimodal config: the language model
            cfg = {**cfg["text_config"], "model_type": "gemma3_text"}
        return _families(hybrid_fields, cfg, origin)
    if kind in PARALLEL_TYPES:
        return _families(parallel_fields, cfg, origin)
    if kind == "gpt2":
        hidden = _hf_int(cfg, "n_embd", origin)
        heads = _hf_int(cfg, "n_head", origin)
        return {"name": "gpt2", "family": "gpt", "layers": _hf_int(cfg, "n_layer", origin), "hidden": hidden,
                "heads": heads, "kv_heads": heads, "ffn": _hf_int(cfg, "n_inner", origin, 4 * hidden),
                "vocab": _hf_int(cfg, "vocab_size", origin), "norm": "layernorm", "activation": "gelu",
                "position": "learned", "tied_embeddings": True, "bias": True, "dropout": True,
                **_training_seq(_hf_int(cfg, "n_positions", origin, None), "n_positions", origin)}
    raise ConfigError(f"{origin}: unsupported Hugging Face model_type {kind!r}; "
                      f"supported: {', '.join(_SUPPORTED)} "
                      "(or write a stageopt YAML)")


def _families(reader, cfg: dict[str, Any], origin: str) -> dict[str, Any]:
    """Fields from a family module's reader, given the typed accessors and the training ``seq``."""
    def num(key: str, default: Any = _REQUIRED) -> int:
        return _hf_int(cfg, key, origin, default)

    def flag(key: str, default: bool) -> bool:
        return _hf_bool(cfg, key, origin, default)

    seq = _training_seq(num("max_position_embeddings", None), "max_position_embeddings", origin)
    return {**reader(cfg, origin, num, flag), **seq}


# Llama-shaped decoders (RMSNorm, gated MLP, RoPE, no biases). Stated approximations: Gemma's gated GELU is
# priced as SwiGLU (same GEMMs), OLMo's non-parametric norm as RMSNorm (its weights, h a norm, are counted),
# OLMo 2's query/key norms over the whole projection as per-head ones (same bytes), Granite's scaling
# multipliers are left out (elementwise work only).
_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo", "olmo2", "phi3",
               "granite", "gemma")
_QK_NORM = ("qwen3", "qwen3_moe", "olmo2")  # query/key norms before RoPE (their modeling code's q_norm/k_norm)
_TIED_BY_DEFAULT = ("gemma",)  # GemmaConfig ties the output layer to the embedding unless told otherwise
_SUPPORTED = (*_LLAMA_LIKE, "gpt2", *DEEPSEEK_TYPES, *HYBRID_TYPES, *PARALLEL_TYPES)


def _training_seq(limit: int | None, key: str, origin: str) -> dict[str, Any]:
    """``seq`` of an imported config: HF_DEFAULT_SEQ, or the model's position limit when that is shorter."""
    bound, why = MODEL_BOUNDS["seq"]
    if limit is not None and not 0 < limit <= bound:
        raise ConfigError(f"{origin}: Hugging Face config field {key!r} = {shorten(limit)} is outside 1..{bound:.0e} "
                          f"({why}); check for a typo")
    if limit is None:
        return {"seq": HF_DEFAULT_SEQ, _ASSUMED: {"seq": "stageopt's default training sequence length"}}
    if limit < HF_DEFAULT_SEQ:
        return {"seq": limit, _ASSUMED: {"seq": f"the config's {key}={limit}, below the default {HF_DEFAULT_SEQ}"}}
    return {"seq": HF_DEFAULT_SEQ, _ASSUMED: {"seq": f"stageopt's default training sequence length; the config's "
                                                     f"{key}={limit} is its longest context, not its training length"}}


def _qwen_moe(cfg: dict[str, Any], layers: int, origin: str) -> dict[str, Any]:
    """Routed experts of Qwen2-MoE / Qwen3-MoE, plus Qwen2-MoE's always-on shared expert.

    The shared expert (``shared_expert_intermediate_size`` wide) is modelled as
    ``shared_experts`` experts of the routed width, which has the same weights and
    FLOPs; its one-output sigmoid gate (``hidden`` weights per layer) is left out.
    Dense layers must lead: ModelSpec's ``dense_layers`` counts them from the input.
    """
    routed = _hf_int(cfg, "moe_intermediate_size", origin)
    out: dict[str, Any] = {"family": "moe", "experts": _hf_int(cfg, "num_experts", origin),
                           "top_k": _hf_int(cfg, "num_experts_per_tok", origin), "expert_ffn": routed}
    shared = _hf_int(cfg, "shared_expert_intermediate_size", origin, 0)
    if shared:
        if shared % routed:
            raise ConfigError(f"{origin}: shared_expert_intermediate_size={shared} is not a multiple of "
                              f"moe_intermediate_size={routed}; stageopt models the shared expert as whole experts "
                              "of the routed width (write a stageopt YAML with shared_experts and expert_ffn)")
        out["shared_experts"] = shared // routed
    step = _hf_int(cfg, "decoder_sparse_step", origin, 1)
    listed = cfg.get("mlp_only_layers") or []
    if not isinstance(listed, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in listed):
        raise ConfigError(f"{origin}: Hugging Face config field 'mlp_only_layers' = {shorten(listed)} must be a list "
                          "of layer indices")
    dense = sorted(listed)
    if step != 1 or dense != list(range(len(dense))):
        raise ConfigError(f"{origin}: decoder_sparse_step={step}, mlp_only_layers={dense}: stageopt supports dense "
                          "layers only as the first layers (decoder_sparse_step 1, mlp_only_layers 0..k-1)")
    if len(dense) >= layers:
        raise ConfigError(f"{origin}: mlp_only_layers covers all {layers} layers; use model_type qwen2/qwen3")
    out["dense_layers"] = len(dense)
    return out
