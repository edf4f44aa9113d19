"""Worked example: Llama 3 70B on 8-64 H100, colocated against disaggregated serving.

For each GPU count and each deployment mode, the highest request rate (goodput)
some plan of that mode sustains within the SLO (TTFT p90 <= 1 s, TPOT p90 <= 40 ms)
for chat-like requests (prompts ~N(2048, 512), answers ~N(256, 64) tokens). The
plans searched are every TP degree of 2, 4 or 8 with every instance count (and,
disaggregated, every split of the GPUs between prefill and decode instances),
max_seqs 64/128/256 and chunk (max_tokens) 2048/8192, bf16 weights.

Method, on the library functions `stageopt search` uses: bisecting a grid of rates,
the analytical screen (the steady state's mean TTFT and TPOT within the SLO) finds
the plans that might pass; the request simulation then checks the p90 of the
screen's best plan (lowest mean TPOT) at the highest such rate, stepping down the
grid until one passes. Writes goodput.csv and goodput.png beside this script.

Run: python experiments/serving/colocated_vs_disaggregated.py   (about 5 minutes on 2 cores)
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.serving.deployment import PoolCache, estimate
from stageopt.serving.serving_search import enumerate_plans
from stageopt.serving.serving_space import PLAN_DEFAULTS, ServingSpace
from stageopt.serving.traffic import Lengths, Slo, Traffic

HERE = Path(__file__).resolve().parent
GPUS = (8, 16, 24, 32, 48, 64)
RATES = tuple(r / 2 for r in range(2, 161))  # 1 to 80 requests/s in steps of 0.5
SLO = Slo(ttft_ms=1000, tpot_ms=40, percentile=90)


def space_for(gpus: int, mode: str, traffic: Traffic) -> ServingSpace:
    plan = {**PLAN_DEFAULTS, "mode": (mode,), "tp": (2, 4, 8), "max_seqs": (64, 128, 256),
            "max_tokens": (2048, 8192)}
    return ServingSpace(name="worked-example", description="", source="", model=load_model("llama3-70b", []),
                        model_source="llama3-70b", traffic=traffic, slo=SLO, hardware=("h100-sxm",), gpus=(gpus,),
                        hw_set=(), plan=plan, prices={"h100-sxm": 3.0})


def screened(space: ServingSpace, hw, cache: PoolCache) -> list:
    ok = []
    for plan in enumerate_plans(space):
        try:
            est = estimate(space.model, hw, plan, space.traffic, simulate=False, cache=cache)
        except InfeasiblePlan:
            continue
        s = est.steady
        if not s.saturated and s.ttft_s * 1e3 <= SLO.ttft_ms and s.tpot_s * 1e3 <= SLO.tpot_ms:
            ok.append((s.tpot_s, s.ttft_s, plan))
    return sorted(ok, key=lambda x: (x[0], x[1]))


def goodput(gpus: int, mode: str, hw, cache: PoolCache) -> dict:
    base = Traffic(rate=1.0, input=Lengths(kind="normal", a=2048, b=512), output=Lengths(kind="normal", a=256, b=64),
                   requests=800, seed=1)
    def passes(i: int) -> bool:
        return bool(screened(space_for(gpus, mode, dataclasses.replace(base, rate=RATES[i])), hw, cache))

    lo, hi = -1, len(RATES) - 1  # the screen gets stricter as the rate grows: bisect for the last rate it passes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid - 1)
    for rate in reversed(RATES[:lo + 1]):
        traffic = dataclasses.replace(base, rate=rate)
        _, _, plan = screened(space_for(gpus, mode, traffic), hw, cache)[0]
        est = estimate(load_model("llama3-70b", []), hw, plan, traffic, simulate=True, cache=cache)
        if est.meets(SLO):
            return {"gpus": gpus, "mode": mode, "goodput_req_s": rate, "plan": plan.describe(),
                    "ttft_p90_ms": round(est.sim.percentile("ttft", 90) * 1e3, 1),
                    "tpot_p90_ms": round(est.sim.percentile("tpot", 90) * 1e3, 2),
                    "output_tokens_per_s_per_gpu": round(est.output_tokens_per_s / gpus, 1)}
    return {"gpus": gpus, "mode": mode, "goodput_req_s": 0.0, "plan": "", "ttft_p90_ms": "", "tpot_p90_ms": "",
            "output_tokens_per_s_per_gpu": 0.0}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in (("colocated", "-o"), ("disaggregated", "--s")):
        pts = [r for r in rows if r["mode"] == mode]
        a.plot([r["gpus"] for r in pts], [r["goodput_req_s"] for r in pts], style, label=mode)
        b.plot([r["gpus"] for r in pts], [r["goodput_req_s"] / r["gpus"] for r in pts], style, label=mode)
    a.set_xlabel("H100 GPUs"), a.set_ylabel("goodput (requests/s within the SLO)")
    b.set_xlabel("H100 GPUs"), b.set_ylabel("goodput per GPU (requests/s)")
    for ax in (a, b):
        ax.grid(alpha=0.3), ax.legend()
    fig.suptitle("Llama 3 70B, prompts ~2K, answers ~256 tokens; TTFT p90 <= 1 s, TPOT p90 <= 40 ms", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    hw = load_hardware("h100-sxm")
    cache = PoolCache()
    rows = []
    for gpus in GPUS:
        for mode in ("colocated", "disaggregated"):
            row = goodput(gpus, mode, hw, cache)
            print(row, flush=True)
            rows.append(row)
    with open(HERE / "goodput.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, HERE / "goodput.png")


if __name__ == "__main__":
    main()
