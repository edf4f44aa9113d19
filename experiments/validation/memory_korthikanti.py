"""Activation memory per GPT layer: stageopt's graph vs Korthikanti et al. 2022 (Table 2 formulas).

For the paper's four models (22B, 175B, 530B, 1T; t=8, s=2048, micro-batch 1, fp16 with
dropout, eager attention: the megatron-lm-2021 framework profile) and each of its five configurations, compares the bytes the graph
saves for backward with the closed form. Writes memory_korthikanti.csv and .png.
Run: python experiments/validation/memory_korthikanti.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.model import load_model
from stageopt.parallel.plan import Plan

HERE = Path(__file__).resolve().parent
MODELS = {"22B": (48, 6144, 64), "175B": (96, 12288, 96), "530B": (105, 20480, 128), "1T": (128, 25600, 160)}
S, B, T = 2048, 1, 8

CONFIGS = {
    "no parallelism": ("tp=1", lambda h, a: S * B * h * (34 + 5 * a * S / h)),
    "TP": (f"tp={T}", lambda h, a: S * B * h * (10 + 24 / T + 5 * a * S / (h * T))),
    "TP+SP": (f"tp={T} sp=on", lambda h, a: S * B * h / T * (34 + 5 * a * S / h)),
    "TP+SP+selective": (f"tp={T} sp=on recompute=selective", lambda h, a: S * B * h * 34 / T),
    "full recompute": (f"tp={T} recompute=full", lambda h, a: 2 * S * B * h),
}


def main() -> None:
    rows = []
    for name, (layers, hidden, heads) in MODELS.items():
        model = load_model("gpt3-175b", [f"layers={layers}", f"hidden={hidden}", f"heads={heads}",
                                         f"kv_heads={heads}", f"ffn={4 * hidden}", f"seq={S}"])
        for config, (plan_text, formula) in CONFIGS.items():
            plan = Plan.parse(f"{plan_text} mbs={B}", framework=load_profile("megatron-lm-2021"))
            block = compile_block("dense", arch_of(model, plan), plan.recompute)
            got = float(block.evaluate(symbol_values(model, plan))["saved_bytes"])
            want = formula(hidden, heads)
            rows.append([name, config, round(got / 2**20, 2), round(want / 2**20, 2), round(100 * (got / want - 1), 3)])
    with open(HERE / "memory_korthikanti.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["model", "configuration", "stageopt_MiB_per_layer", "paper_MiB_per_layer", "error_pct"])
        out.writerows(rows)
    print(f"{'model':<6} {'configuration':<18} {'stageopt MiB':>13} {'paper MiB':>10} {'error':>7}")
    for r in rows:
        print(f"{r[0]:<6} {r[1]:<18} {r[2]:>13.1f} {r[3]:>10.1f} {r[4]:>6.2f}%")
    _plot(rows)


def _plot(rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4))
    configs = list(CONFIGS)
    width = 0.8 / len(MODELS)
    for i, name in enumerate(MODELS):
        vals = [next(r[2] for r in rows if r[0] == name and r[1] == c) for c in configs]
        paper = [next(r[3] for r in rows if r[0] == name and r[1] == c) for c in configs]
        x = np.arange(len(configs)) + i * width
        ax.bar(x, vals, width, label=f"GPT-{name} (stageopt)")
        ax.scatter(x, paper, color="k", marker="_", s=120, zorder=3, label="paper formula" if i == 0 else None)
    ax.set_xticks(np.arange(len(configs)) + 0.4 - width / 2, configs, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("activation MiB per layer (t=8, s=2048, b=1)")
    ax.set_title("Activation memory vs Korthikanti et al. 2022")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "memory_korthikanti.png", dpi=120)


if __name__ == "__main__":
    main()
