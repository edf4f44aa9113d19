"""``stageopt inspect``: what one plan costs, per pipeline stage, from the graph."""

from __future__ import annotations

import argparse
import json

from stageopt.commands.arguments import add_model_plan_args, workload_from_args
from stageopt.workload.summary import inspect_report


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="per-stage FLOPs, bytes, collectives and memory of a plan")
    add_model_plan_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    rep = inspect_report(workload_from_args(args))
    print(json.dumps(rep, indent=1) if args.json else render_report(rep))
    return 0


def _human(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def render_report(rep: dict) -> str:
    lines = [f"model {rep['model']}  gpus {rep['gpus']}  plan: {rep['plan']}",
             f"params {_human(rep['params_total'])} (active {_human(rep['params_active'])})  "
             f"micro-batches/iteration {rep['microbatches']}  tokens/iteration {rep['tokens_per_iteration']:,}",
             f"training FLOPs/iteration (all ranks) {_human(rep['flops_per_iteration'], 'FLOP')}  "
             f"peak memory {rep['peak_memory_gib']:.2f} GiB", ""]
    for st in rep["stages"]:
        f, mem = st["flops"], st["memory_gib"]
        lines.append(f"stage {st['stage']}: {st['layers']} layers, {st['ops']:,} ops/iteration, "
                     f"FLOPs fwd {_human(f['fwd'])} bwd {_human(f['bwd'])} recompute {_human(f['recompute'])}, "
                     f"bytes {_human(st['bytes_accessed'], 'B')}, p2p {_human(st['p2p_bytes'], 'B')}")
        lines.append("  memory GiB: " + "  ".join(f"{k} {v:.2f}" for k, v in mem.items()))
        for c in st["collectives"]:
            lines.append(f"  {c['phase']:>9} {c['group']:>6}({c['group_size']}) {c['type']:<15} "
                         f"x{c['count']:<6} {_human(c['bytes_each'], 'B'):>10} each, {_human(c['bytes_total'], 'B')} total")
    return "\n".join(lines)
