"""``stageopt presets``: list the model, hardware and framework presets that ship (``--fields``: the keys)."""

from __future__ import annotations

import argparse
import dataclasses

from stageopt.frameworks import DEFAULT_FRAMEWORK, list_profiles, load_profile
from stageopt.hardware import hw_override_keys, list_hardware_presets
from stageopt.inputs.limits import MODEL_BOUNDS
from stageopt.model import ModelSpec, list_model_presets, load_model
from stageopt.parallel.plan import Plan


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list model, hardware and framework presets (--fields: settable keys)")
    p.add_argument("--fields", action="store_true",
                   help="list the keys --set (model), --hw-set (hardware) and --plan accept, with bounds")
    p.set_defaults(run=run)


def print_fields() -> None:
    """The keys users can set, so an 'unknown key' error can point somewhere real."""
    print("model fields (--set KEY=VALUE, or keys of a model YAML):")
    for f in dataclasses.fields(ModelSpec):
        default = "required" if f.default is dataclasses.MISSING else f"default {f.default!r}"
        bound = f", at most {MODEL_BOUNDS[f.name][0]:.0e}" if f.name in MODEL_BOUNDS else ""
        print(f"  {f.name:<15} {f.type:<5} {default}{bound}")
    print("hardware keys (--hw-set KEY=VALUE):")
    for key in hw_override_keys():
        print(f"  {key}")
    print("plan keys (--plan \"KEY=VALUE ...\"):")
    print("  " + " ".join(f.name for f in dataclasses.fields(Plan)))


def run(args: argparse.Namespace) -> int:
    if args.fields:
        print_fields()
        return 0
    print("models:")
    for name in list_model_presets():
        m = load_model(name)
        moe = f", {m.experts} experts top-{m.top_k}" if m.is_moe else ""
        print(f"  {name:<15} {m.family:<6} layers={m.layers} hidden={m.hidden} heads={m.heads}/{m.kv_heads}{moe}")
    print("hardware:")
    for name in list_hardware_presets():
        print(f"  {name}")
    print(f"frameworks (default {DEFAULT_FRAMEWORK}):")
    for name in list_profiles():
        print(f"  {name:<19} {load_profile(name).description}")
    return 0
