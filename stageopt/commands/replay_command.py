"""``stageopt replay``: time a Chakra trace set the way ASTRA-sim's congestion-unaware backend does.

Prints one line per rank in ASTRA-sim's own format, then the step time (the
slowest rank), so the output can be diffed against a real ASTRA-sim run.
Exit codes: 0 done, 2 bad input (missing file, malformed config or trace).
"""

from __future__ import annotations

import argparse
import json

from stageopt.astrasim.trace_replay import replay_trace_set
from stageopt.console import LOG_INTERVAL_S


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay Chakra traces with ASTRA-sim's analytical (congestion-unaware) timing",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--workload", required=True, metavar="PREFIX",
                        help="trace prefix: rank R reads PREFIX.R.et (ASTRA-sim's --workload-configuration)")
    parser.add_argument("--comm-group", default=None, metavar="FILE",
                        help="communicator-group JSON (ASTRA-sim's --comm-group-configuration); omit for none")
    parser.add_argument("--system", required=True, metavar="FILE", help="ASTRA-sim system JSON")
    parser.add_argument("--network", required=True, metavar="FILE", help="analytical network YAML")
    parser.add_argument("--memory", default=None, metavar="FILE",
                        help="remote-memory JSON (ASTRA-sim's --remote-memory-configuration); needed only by traces "
                             "with MEM_LOAD/MEM_STORE nodes (activation offloading's host copies)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--progress", choices=("auto", "off"), default="auto",
                        help=f"ranks read and trace nodes replayed, with rate and ETA, on stderr (auto: a live bar "
                             f"on a terminal, a line every {LOG_INTERVAL_S:g} s in a log, nothing for short runs)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    result = replay_trace_set(args.workload, args.comm_group, args.system, args.network,
                              progress=args.progress == "auto", memory_path=args.memory)
    if args.json:
        print(json.dumps({"ranks": len(result.ranks), **result.to_dict()}))
        return 0
    for timing in result.ranks:
        print(timing.astra_line())
    print(f"step time: {result.max_cycles} cycles ({result.max_cycles / 1e9:.6f} s)")
    return 0
