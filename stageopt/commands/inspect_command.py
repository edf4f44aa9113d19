"""``stageopt inspect``: what one plan costs, per pipeline stage, from the graph."""

from __future__ import annotations

import argparse
import json

from stageopt.commands.arguments import add_model_plan_args, workload_from_args
from stageopt.errors import ConfigError
from stageopt.hardware.headroom import fit_line, memory_fit
from stageopt.sim.run import hardware_for
from stageopt.workload.summary import inspect_report


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="per-stage FLOPs, bytes, collectives and memory of a plan")
    add_model_plan_args(p)
    p.add_argument("--hardware", help="say whether the plan fits this hardware preset or YAML file's HBM")
    p.add_argument("--hw-set", dest="hw_set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware field, e.g. gpu.hbm_gib=96 (repeatable; with --hardware)")
    add_reserve_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def add_reserve_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reserve-gib", type=float, metavar="GIB",
                        help="HBM kept free per GPU (CUDA context, NCCL, allocator slack); default: the hardware "
                             "file's gpu.reserve_gib, else 2 GiB + 3%% of HBM")


def hardware_fit(args: argparse.Namespace, peak_gib: float) -> dict | None:
    """The memory fit on ``--hardware`` (None without it), with the reserve of ``--reserve-gib`` or the hardware."""
    if not args.hardware:
        if args.hw_set or args.reserve_gib is not None:
            raise ConfigError("--hw-set and --reserve-gib need --hardware (the machine whose HBM is checked)")
        return None
    if args.reserve_gib is not None and args.reserve_gib < 0:
        raise ConfigError(f"--reserve-gib {args.reserve_gib:g}: must be >= 0 (GiB kept free per GPU)")
    hw = hardware_for(args.hardware, args.hw_set)
    reserve = args.reserve_gib if args.reserve_gib is not None else hw.gpu.memory_reserve_gib()
    return {"hardware": args.hardware, **memory_fit(peak_gib, hw.gpu.hbm_gib, reserve)}


def run(args: argparse.Namespace) -> int:
    rep = inspect_report(workload_from_args(args))
    fit = hardware_fit(args, rep["peak_memory_gib"])
    if fit is not None:
        rep["memory_fit"] = fit
    text = render_report(rep)
    if fit is not None:
        text += "\n" + fit_line(fit, fit["hardware"])
    print(json.dumps(rep, indent=1) if args.json else text)
    return 0


def _human(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def render_report(rep: dict) -> str:
    lines = [f"model {rep['model']}  gpus {rep['gpus']}  plan: {rep['plan']}",
             f"params {_human(rep['params_total'])} (active {_human(rep['params_active'])})  "
             f"micro-batches/iteration {rep['microbatches']}"
             + (f" in {rep['flushes']} pipeline flushes" if rep.get("flushes", 1) > 1 else "")
             + f"  tokens/iteration {rep['tokens_per_iteration']:,}",
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
