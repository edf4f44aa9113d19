"""Arguments shared by the commands that take a model and a plan."""

from __future__ import annotations

import argparse

from stageopt.hardware import Hardware
from stageopt.sim.run import hardware_for, workload_for
from stageopt.workload import Workload


def add_model_plan_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    parser.add_argument("--set", dest="model_set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model field (repeatable)")
    parser.add_argument("--plan", required=True,
                        help='e.g. "tp=8 pp=4 dp=32 mbs=1 gbs=1536 zero=1 recompute=full sp=on"')
    parser.add_argument("--gpus", type=int, help="GPU count; dp is derived from it when the plan omits dp")
    parser.add_argument("--framework", metavar="NAME|FILE",
                        help="software stack the plan runs on: a profile from 'stageopt presets' or a YAML file "
                             "(default megatron-core); plan knobs (sp, tp_overlap, dp_overlap, zero) override it")


def workload_from_args(args: argparse.Namespace) -> Workload:
    return workload_for(args.model, args.plan, args.gpus, framework=args.framework, model_set=args.model_set)


def add_hardware_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", default="h100-sxm", help="hardware preset or YAML file (default h100-sxm)")
    parser.add_argument("--hw-set", dest="hw_set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a hardware field, e.g. scaleout.bandwidth_gbps=100 (repeatable)")


def hardware_from_args(args: argparse.Namespace) -> Hardware:
    return hardware_for(args.hardware, args.hw_set)
