"""Published training runs as stageopt inputs, for calibration and fidelity checks.

Reads ``published_runs.csv`` (Megatron-LM papers and benchmark tables; see
``../shared/validation``) into a model, a plan, a hardware preset and the
measured TFLOP/s per GPU, and compares them with the analytical model.
Assumptions for fields a source leaves blank are stated in ``row_to_case``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stageopt.frameworks import load_profile
from stageopt.hardware import Hardware, apply_hw_overrides, load_hardware
from stageopt.model import load_model
from stageopt.model.spec import ModelSpec
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_batch import evaluate_plans

GPU_PRESET = {"A100": "a100-80g", "H100": "h100-sxm"}


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    model: ModelSpec
    plan: Plan
    hardware: str
    measured_tflops: float
    counts_recompute: bool  # the source's FLOP formula includes recomputation


def _int(value: str, default: int) -> int:
    return int(float(value)) if value.strip() else default


def row_to_case(row: dict[str, str]) -> Case:
    """One CSV row as a Case.

    Blank ffn means 4h (GPT); blank micro-batch means 1; Megatron-LM's 2021 runs use
    full activation recomputation on the megatron-lm-2021 stack, and count
    recomputation in their FLOP formula (Narayanan et al. 2021, sec. 5.1);
    Megatron-Core's H100 table is read as model FLOPs with no recomputation on
    the megatron-core stack.
    """
    hidden = int(row["hidden"])
    heads = int(row["heads"])
    megatron21 = row["id"].startswith("MEG21")
    model = load_model("gpt3-175b", [
        f"layers={row['layers']}", f"hidden={hidden}", f"heads={heads}",
        f"kv_heads={_int(row['kv_heads'], heads)}", f"ffn={_int(row['ffn'], 4 * hidden)}",
        f"vocab={row['vocab']}", f"seq={row['seq_len']}"]).replace(name=row["model"])
    tp, pp, dp = int(row["TP"]), int(row["PP"]), int(row["DP"])
    mbs = _int(row["micro_batch"], 1)
    zero = 3 if "ZeRO-3" in row["zero_fsdp"] else 0
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=_int(row["CP"], 1), mbs=mbs, gbs=int(row["global_batch"]),
                vpp=_int(row["VP"], 1), schedule="interleaved" if _int(row["VP"], 1) > 1 else "1f1b",
                zero=zero, recompute="full" if megatron21 else "none",
                dtype="fp16" if "FP16" in row["precision"] else "bf16",
                framework=load_profile("megatron-lm-2021" if megatron21 else "megatron-core"))
    gpu = next(v for k, v in GPU_PRESET.items() if k in row["gpu"])
    return Case(id=row["id"], source="Megatron-LM 2021" if megatron21 else "Megatron-Core H100",
                model=model, plan=plan, hardware=gpu, measured_tflops=float(row["value"]),
                counts_recompute=megatron21)


def load_cases(path: Path) -> list[Case]:
    with open(path, newline="") as fh:
        return [row_to_case(r) for r in csv.DictReader(fh)]


def predict(cases: list[Case], hw_overrides: dict[str, list[str]] | None = None) -> np.ndarray:
    """Predicted TFLOP/s per GPU for each case, in the source's FLOP convention."""
    out = np.zeros(len(cases))
    for i, case in enumerate(cases):
        hw: Hardware = apply_hw_overrides(load_hardware(case.hardware), (hw_overrides or {}).get(case.hardware, []))
        res = evaluate_plans(case.model, hw, [case.plan])
        key = "hardware_tflops_per_gpu" if case.counts_recompute else "model_tflops_per_gpu"
        out[i] = res[key][0]
    return out


def mape(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - measured) / measured) * 100)
