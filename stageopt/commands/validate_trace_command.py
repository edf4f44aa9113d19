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
    parser.add_argument("--workers", type=int, default=None,
                        help=f"processes checking files in parallel (default: 1 below {AUTO_WORKERS_FROM} files, "
                             f"else up to 4; this machine has {os.cpu_count()} cores)")
    parser.add_argument("--every-file", action="store_true",
                        help="decode and check every file node by node instead of one file per symmetric class "
                             "(same report, much slower on large sets)")
    parser.set_defaults(run=run)


AUTO_WORKERS_FROM = 4096


def default_workers(directory: str, prefix: str) -> int:
    """One process for small sets (start-up costs more than it saves), up to 4 for large ones."""
    try:
        with os.scandir(directory) as it:
            count = sum(1 for e in it if e.name.startswith(prefix) and e.name.endswith(".et"))
    except OSError:
        return 1  # validate_trace_dir names the problem
    return min(os.cpu_count() or 1, 4) if count >= AUTO_WORKERS_FROM else 1


def format_report(report: ValidationReport, directory: str) -> str:
    """Human-readable summary: verdict, counts, then listed findings."""
    lines = [
        f"{directory}: {'OK' if report.ok else 'INVALID'} — {report.n_files} files, {report.n_nodes} nodes, "
        f"{report.n_violations} violation(s), {report.n_warnings} warning(s)",
        "nodes: " + ", ".join(f"{k} {v}" for k, v in report.node_counts.items()),
        f"comm groups: {report.comm_group_file or 'none'}",
        f"checked node by node: {report.n_full_checks} file(s); the other {report.n_files - report.n_full_checks} "
        "matched one of them up to their own groups, peers and tags (checked)",
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
        workers=args.workers if args.workers is not None else default_workers(args.directory, args.prefix),
        by_class=not args.every_file,
    )
    print(format_report(report, args.directory))
    return 0 if report.ok else 1
