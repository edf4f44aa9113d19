"""``stageopt presets``: list the model, hardware and framework presets that ship."""

from __future__ import annotations

import argparse

from stageopt.frameworks import DEFAULT_FRAMEWORK, list_profiles, load_profile
from stageopt.hardware import list_hardware_presets
from stageopt.model import list_model_presets, load_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list model, hardware and framework presets")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
