"""``stageopt presets``: list the model, hardware and framework presets that ship (``--fields``: the keys)."""

from __future__ import annotations

import argparse
import dataclasses

from stageopt.console import render_rows
from stageopt.frameworks import DEFAULT_FRAMEWORK, list_profiles, load_profile
from stageopt.hardware import hw_override_keys, list_hardware_presets, load_hardware
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
    fields = dataclasses.fields(ModelSpec)
    width = max(len(f.name) for f in fields)
    for f in fields:
        default = "required" if f.default is dataclasses.MISSING else f"default {f.default!r}"
        bound = f", at most {MODEL_BOUNDS[f.name][0]:.0e}" if f.name in MODEL_BOUNDS else ""
        print(f"  {f.name:<{width}} {f.type:<5} {default}{bound}")
    print("hardware keys (--hw-set KEY=VALUE):")
    for key in hw_override_keys():
        print(f"  {key}")
    print("plan keys (--plan \"KEY=VALUE ...\"):")
    print("  " + " ".join(f.name for f in dataclasses.fields(Plan)))


def run(args: argparse.Namespace) -> int:
    if args.fields:
        print_fields()
        return 0
    models = [load_model(name) for name in list_model_presets()]
    print("models:")
    print(render_rows(["name", "family", "layers", "hidden", "heads", "kv heads", "experts", "seq"],
                      [[m.name, m.family, m.layers, m.hidden, m.heads, m.kv_heads,
                        f"{m.experts} top-{m.top_k}" if m.is_moe else "", m.seq] for m in models],
                      align=["left", "left", "right", "right", "right", "right", "right", "right"]))
    machines = [load_hardware(name) for name in list_hardware_presets()]
    print("\nhardware:")
    print(render_rows(["name", "GPU", "bf16 TFLOP/s", "fp8", "fp4", "HBM GiB", "GPUs per node", "$/GPU-hour",
                       "error held out (runs)"],
                      [[h.name, h.gpu.name, *(_peak(getattr(h.gpu.peak_tflops, d)) for d in ("bf16", "fp8", "fp4")),
                        f"{h.gpu.hbm_gib:g}", h.node.gpus, f"{h.cost_per_gpu_hour:.2f}", _accuracy(h)] for h in machines],
                      align=["left", "left", "right", "right", "right", "right", "right", "right", "right"]))
    print(f"\nframeworks (default {DEFAULT_FRAMEWORK}):")
    profiles = [load_profile(n) for n in list_profiles()]
    print(render_rows(["name", "attention", "low precision", "fp8 recipe", "NCCL", "description"],
                      [[p.name, _attention(p), _low_precision(p),
                        p.fp8_recipe if "fp8" in p.low_precision else "-", p.nccl_release or "(hardware)",
                        p.description] for p in profiles],
                      align=["left", "left", "left", "left", "left", "left"]))
    return 0


# How the table names each fused attention kernel a profile can run (FrameworkProfile.attention_kernel).
ATTENTION_KERNEL_LABELS = {"best": "cuDNN today", "cudnn-2024": "cuDNN 2024", "fa2": "FlashAttention-2",
                           "flex": "FlexAttention"}


def _attention(profile) -> str:
    """The attention a profile prices: eager (unfused softmax), the model's choice, or its fused kernel."""
    if profile.attention == "eager":
        return "eager"
    kernel = ATTENTION_KERNEL_LABELS.get(profile.attention_kernel, profile.attention_kernel)
    return kernel if profile.attention == "flash" else f"model's ({kernel} if flash)"


def _low_precision(profile) -> str:
    """The low-precision recipes a profile ships, and whether their weights stay BF16 (``fp8_params`` off)."""
    if not profile.low_precision:
        return "-"
    names = ", ".join(profile.low_precision)
    return names if profile.fp8_params else f"{names} (bf16 weights)"


def _accuracy(hw) -> str:
    """Throughput MAPE with each source held out of the preset's fit, over the runs it covers ('-': never fitted)."""
    record = hw.measured_accuracy
    return "-" if record is None else f"{record.held_out_mape:.1f}% ({record.runs})"


def _peak(tflops: float | None) -> str:
    """A dense peak for the table; '-' where the GPU has no tensor cores for the type."""
    return "-" if tflops is None else f"{tflops:g}"
