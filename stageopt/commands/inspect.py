"""``stageopt inspect``: what one plan costs, per pipeline stage, from the graph."""

from __future__ import annotations

import argparse
import json

from stageopt.commands._common import add_model_plan_args, workload_from_args
from stageopt.report import inspect_report, render_report


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="per-stage FLOPs, bytes, collectives and memory of a plan")
    add_model_plan_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    rep = inspect_report(workload_from_args(args))
    print(json.dumps(rep, indent=1) if args.json else render_report(rep))
    return 0
