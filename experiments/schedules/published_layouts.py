"""Which plan each modern-plan space picks, against the layout the model's makers published.

Usage: python experiments/schedules/published_layouts.py

Runs ``stageopt search`` (analytical) on ``search_spaces/llama3-405b-16k.yaml`` and
``search_spaces/deepseek-v3-2k.yaml`` and ``stageopt simulate`` on the published layouts (Llama 3 report
Table 4; DeepSeek-V3 report sec. 3.2), all through the CLI. Prints a Markdown table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

STAGEOPT = str(Path(sys.executable).with_name("stageopt"))
SPACES = {
    "llama3-405b-16k": {
        "sim": ["--model", "llama3-405b", "--set", "seq=8192", "--gpus", "16384", "--hardware", "h100-sxm",
                "--framework", "megatron-core"],
        "published": [
            ("Llama 3 report (vpp unstated; 2)", "tp=8 cp=1 pp=16 vpp=2 schedule=interleaved embed_split=on "
             "loss_split=on mbs=1 gbs=2048 zero=1 recompute=selective"),
            ("same, vpp=4", "tp=8 cp=1 pp=16 vpp=4 schedule=interleaved embed_split=on loss_split=on mbs=1 "
             "gbs=2048 zero=1 recompute=selective"),
            ("same, no interleaving (what main could express)", "tp=8 cp=1 pp=16 mbs=1 gbs=2048 zero=1 "
             "recompute=selective")],
    },
    "deepseek-v3-2k": {
        "sim": ["--model", "deepseek-v3", "--gpus", "2048", "--hardware", "h100-sxm", "--hw-set",
                "node.bandwidth_gbps=200", "--framework", "hai-llm"],
        "published": [
            ("DeepSeek-V3 report: pp16 DualPipe ep64 ZeRO-1", "tp=1 pp=16 ep=64 mbs=1 gbs=15360 zero=1 "
             "schedule=dualpipe last_layers=1 recompute=none"),
            ("same with full recompute", "tp=1 pp=16 ep=64 mbs=1 gbs=15360 zero=1 schedule=dualpipe "
             "last_layers=1 recompute=full"),
            ("same plan, 1F1B (nothing hides the all-to-all)", "tp=1 pp=16 ep=64 mbs=1 gbs=15360 zero=1 "
             "schedule=1f1b last_layers=1 recompute=none")],
    },
}


def stageopt(*args: str) -> str:
    proc = subprocess.run([STAGEOPT, *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"stageopt {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def row(label: str, est: dict, plan: str) -> str:
    b = est["time_breakdown_s"]
    return (f"| {label} | `{plan}` | {est['iteration_time_s']:.2f} | {100 * est['mfu']:.1f} | "
            f"{est['peak_memory_gib']:.1f} | {b['pipeline_bubble']:.2f} | {b['exposed_ep_comm']:.2f} |")


def main() -> int:
    print("| space / layout | plan | s/iteration | MFU % | peak GiB | bubble s | exposed EP s |")
    print("|---|---|---|---|---|---|---|")
    for name, spec in SPACES.items():
        with tempfile.TemporaryDirectory() as tmp:
            stageopt("search", "--space", name, "--budget", "2000", "--study-name", name, "--runs-dir", tmp)
            best = json.loads((Path(tmp) / name / "best.json").read_text())["best"][0]
        plan = best["plan"].split(" framework=")[0]
        est = json.loads(stageopt("simulate", *spec["sim"], "--plan", plan, "--json"))
        print(row(f"**{name}: search best**", est, plan))
        for label, published in spec["published"]:
            print(row(label, json.loads(stageopt("simulate", *spec["sim"], "--plan", published, "--json")), published))
    return 0


if __name__ == "__main__":
    sys.exit(main())
