"""``stageopt validate-trace DIR``: check per-rank Chakra traces before running ASTRA-sim.

Exit codes: 0 valid (warnings allowed), 1 violations found, 2 usage error
(missing directory, no matching trace files).
"""

from __future__ import annotations

import argparse
import os

from stageopt.chakra.validate import ValidationReport, validate_trace_dir


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate-trace",
        help="check a directory of Chakra ET traces (deps, cycles, attributes, groups, send/recv pairs)",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("directory", help="folder holding <prefix>.<rank>.et files")
    parser.add_argument("--prefix", default="workload", help="trace file prefix (default: workload)")
    parser.add_argument("--comm-groups", default=None,
                        help="communicator-group JSON (default: DIR/comm_groups.json or DIR/<prefix>.json)")
    parser.add_argument("--strict", action="store_true",
                        help="treat non-contiguous ids and non-topological order as errors")
    parser.add_argument("--max-per-kind", type=int, default=20, help="findings listed per kind (default: 20)")
    parser.add_argument("--workers", type=int, default=1,
                        help=f"processes checking files in parallel (this machine has {os.cpu_count()})")
    parser.set_defaults(run=run)


def format_report(report: ValidationReport, directory: str) -> str:
    """Human-readable summary: verdict, counts, then listed findings."""
    lines = [
        f"{directory}: {'OK' if report.ok else 'INVALID'} — {report.n_files} files, {report.n_nodes} nodes, "
        f"{report.n_violations} violation(s), {report.n_warnings} warning(s)",
        "nodes: " + ", ".join(f"{k} {v}" for k, v in report.node_counts.items()),
        f"comm groups: {report.comm_group_file or 'none'}",
    ]
    if report.finding_counts:
        lines.append("findings: " + ", ".join(f"{k} {v}" for k, v in report.finding_counts.items()))
    for title, items, total in (("violations", report.violations, report.n_violations),
                                ("warnings", report.warnings, report.n_warnings)):
        if items:
            shown = f" (first {len(items)} of {total})" if len(items) < total else ""
            lines.append(f"{title}{shown}:")
            lines.extend(f"  {item}" for item in items)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = validate_trace_dir(
        args.directory,
        args.prefix,
        comm_groups=args.comm_groups,
        max_per_kind=args.max_per_kind,
        strict_order=args.strict,
        workers=args.workers,
    )
    print(format_report(report, args.directory))
    return 0 if report.ok else 1
