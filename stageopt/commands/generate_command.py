"""``stageopt generate``: write per-rank Chakra traces and ASTRA-sim configs for a plan.

Writes ``OUT/workload.<rank>.et`` (all ranks, or ``--ranks``), ``comm_groups.json``,
``system.json``, ``network.yml``, ``memory.json`` and ``run_astrasim.sh``, then
prints the ASTRA-sim command line. The binary is found through the
``STAGEOPT_ASTRA_SIM`` environment variable when the script runs.
Exit codes: 0 written, 2 bad input (plan, model, hardware, ranks, output directory).
"""

from __future__ import annotations

import argparse
import time

from stageopt.commands.arguments import add_model_plan_args, workload_from_args
from stageopt.console import LOG_INTERVAL_S
from stageopt.hardware import apply_hw_overrides, load_hardware
from stageopt.inputs.names import check_plain_name
from stageopt.program import BUCKETS, ProgramOptions
from stageopt.program.generate import generate, parse_ranks

PROGRESS_MIN_RANKS = 256


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="write per-rank Chakra traces, comm groups and ASTRA-sim configs",
                       description=__doc__.splitlines()[0])
    add_model_plan_args(p)
    p.add_argument("--hardware", required=True, help="hardware preset name or YAML file (simulators/hardware/)")
    p.add_argument("--hw-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware field (repeatable)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--ranks", default=None, metavar="LIST",
                   help="write only these ranks, e.g. 0-7,12 (default: all); configs still cover every rank")
    p.add_argument("--prefix", default="workload", help="trace file prefix (default: workload)")
    p.add_argument("--dp-bucket", choices=BUCKETS, default=None,
                   help="gradient-sync bucket: one per layer, per model chunk, or one per stage after the last "
                        "backward (default: the framework's); plan dp_overlap=off implies 'stage'")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help=f"ranks written, rate and ETA on stderr: a live bar on a terminal, a line every "
                        f"{LOG_INTERVAL_S:g} s in a log (auto: for >= {PROGRESS_MIN_RANKS} ranks)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    check_plain_name(args.prefix, "--prefix")
    work = workload_from_args(args)
    hw = apply_hw_overrides(load_hardware(args.hardware), args.hw_set)
    ranks = parse_ranks(args.ranks, work.plan.gpus)
    progress = args.progress == "on" or (args.progress == "auto" and len(ranks) >= PROGRESS_MIN_RANKS)
    res = generate(work, hw, args.out, ranks=ranks, prefix=args.prefix,
                   options=ProgramOptions(bucket=args.dp_bucket), progress=progress)
    elapsed = time.perf_counter() - started
    subset = "" if res.ranks == res.world else f" (subset of {res.world}; ASTRA-sim needs all ranks)"
    print(f"wrote {res.ranks} traces{subset}, {res.bytes_written / 1e6:.1f} MB, to {res.out_dir} "
          f"in {elapsed:.2f} s")
    if work.plan.flushes > 1:
        print(f"the traces hold one of the step's {work.plan.flushes} pipeline flushes (plan flushes): a step is "
              f"{work.plan.flushes} back-to-back runs of them and one optimizer step")
    print(f"run ASTRA-sim: {res.out_dir / 'run_astrasim.sh'}   (or: {res.command})")
    return 0
