"""Check a directory of per-rank Chakra traces before handing it to ASTRA-sim.

ASTRA-sim reports a broken trace by hanging, aborting or printing a wrong
time, far from the cause. This validator names the file, node and rule instead.

Errors (``ok`` is False) are what makes ASTRA-sim abort, hang or mis-simulate:
unreadable files, missing rank files, METADATA/INVALID nodes in the stream,
duplicate ids, dependencies on ids absent from the file, cycles, missing or
mistyped attributes (COMP: ``num_ops``, ``tensor_size``; COMM_COLL:
``comm_type``, ``comm_size``, string ``pg_name``; SEND/RECV: peer, tag,
size), collective types ASTRA-sim does not simulate, unknown groups, a rank
issuing on a group it is not in, group members whose collective sequences
(type, size, in node-id order, which is ASTRA-sim's issue order) differ,
unmatched or size-mismatched send/receive pairs, group ranks out of range, and
collectives on a one-rank group.

Warnings (``ok`` stays True) are legal but worth knowing: node ids that are not
``0..n-1`` in file order, dependencies on a larger id (ASTRA-sim accepts both;
STAGE's traces do this), one-rank groups nobody uses, COMP nodes marked
``is_cpu_op`` (they break ASTRA-sim's statistics report) and a metadata
version other than 0.0.4. ``strict_order=True`` turns the ordering warnings
into errors, for checking stageopt's own output.

Files are checked by symmetric class (stageopt.chakra._rank_classes): one
representative per class is decoded and checked node by node, every other file
is only split by a regular expression and its rank-specific values (groups,
peers, tags) are checked against the representative's, so the work grows with
bytes read, not with nodes decoded; the report is the same as a file-by-file
check. One file is in memory at a time (per worker with ``workers > 1``); each
group keeps only a digest of its first member's collective sequence, and files
are re-read only to explain a mismatch.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from stageopt.chakra._file_check import ALL_RANKS, CheckContext, Coll, FileResult, collectives
from stageopt.chakra._rank_classes import check_ranks
from stageopt.chakra.comm_groups import read_comm_groups
from stageopt.chakra.io import read_trace
from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import MAX_GPUS

MAX_WORKERS = 256


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of :func:`validate_trace_dir`; the lists hold the first ``max_per_kind`` findings of each kind."""

    ok: bool
    violations: list[str]
    warnings: list[str]
    n_files: int
    n_nodes: int
    n_violations: int
    n_warnings: int
    node_counts: dict[str, int]
    finding_counts: dict[str, int]
    comm_group_file: str | None
    n_full_checks: int = 0  # files decoded and checked node by node; the others were projected from their class


class _Merge:
    """Accumulates file results and the cross-rank state, then adds cross-rank findings."""

    def __init__(self, ctx: CheckContext, files: dict[int, Path]) -> None:
        self.ctx = ctx
        self.files = files
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.counts: Counter = Counter()
        self.node_counts: Counter = Counter()
        self.n_nodes = 0
        self.reference: dict[int, tuple[int, bytes]] = {}  # group -> (first rank, its digest)
        self.group_use: dict[int, tuple[int, str]] = {}
        self.sends: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)
        self.recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)

    def add(self, level: str, kind: str, message: str, count: int = 1) -> None:
        key = f"{level}:{kind}"
        listed = min(self.counts[key], self.ctx.per_kind)
        self.counts[key] += count
        if listed < self.ctx.per_kind:
            (self.errors if level == "error" else self.warnings).append(f"[{kind}] {message}")

    def file(self, res: FileResult) -> None:
        self.n_nodes += res.n_nodes
        self.node_counts.update(res.node_counts)
        listed: Counter = Counter()
        for level, kind, message in res.findings:
            listed[f"{level}:{kind}"] += 1
            self.add(level, kind, message)
        for key, total in res.finding_counts.items():  # findings the file did not list
            self.counts[key] += total - listed[key]
        for gid, (uses, first) in res.group_use.items():
            old = self.group_use.get(gid, (0, first))
            self.group_use[gid] = (old[0] + uses, old[1])
        for src, dst, tag, size, nid in res.sends:
            self.sends[(src, dst, tag)].append((size, nid))
        for src, dst, tag, size, nid in res.recvs:
            self.recvs[(src, dst, tag)].append((size, nid))
        for gid, dig in res.digests.items():
            ref = self.reference.setdefault(gid, (res.rank, dig))
            if ref[1] != dig:
                self.sequence_mismatch(gid, ref[0], res.rank)

    def _sequence(self, rank: int, gid: int) -> list[Coll]:
        return [c for c in collectives(read_trace(self.files[rank]).nodes) if c.group == gid]

    def sequence_mismatch(self, gid: int, ref_rank: int, rank: int) -> None:
        """Name the first collective where ``rank`` departs from ``ref_rank`` on group ``gid``."""
        members = "all ranks" if gid == ALL_RANKS else f"group {gid} {self.ctx.groups[gid]}"
        if self.counts["error:group-sequence"] >= self.ctx.per_kind:
            self.add("error", "group-sequence", "")  # counted, not explained: re-reading costs time
            return
        ref_seq, seq = self._sequence(ref_rank, gid), self._sequence(rank, gid)
        for i, (a, b) in enumerate(zip(ref_seq, seq)):
            if (a.comm_type, a.size) != (b.comm_type, b.size):
                self.add("error", "group-sequence", f"{members}: collective #{i} is {b.describe()} on rank {rank} "
                         f"but {a.describe()} on rank {ref_rank}")
                return
        self.add("error", "group-sequence", f"{members}: rank {rank} issues {len(seq)} collective(s) on it, "
                 f"rank {ref_rank} issues {len(ref_seq)}")

    def finish(self) -> None:
        """Cross-rank rules: missing rank files, one-rank groups, send/receive matching."""
        world = self.ctx.world
        missing = [r for r in range(world) if r not in self.files]
        if missing:
            more = "..." if len(missing) > 10 else ""
            self.add("error", "files", f"ranks {missing[:10]}{more} have no {self.ctx.prefix}.<rank>.et file "
                     f"(found {len(self.files)} files, highest rank {world - 1})")
        for gid, ranks in self.ctx.groups.items():
            if len(ranks) != 1:
                continue
            uses, first = self.group_use.get(gid, (0, ""))
            if uses:
                self.add("error", "singleton-group", f"group {gid} {ranks} has one rank and is used by {uses} "
                         f"collective(s), first {first}; drop those collectives and the group")
            else:
                self.add("warning", "singleton-group", f"group {gid} {ranks} has one rank (unused)")
        prefix = self.ctx.prefix
        for key in sorted(set(self.sends) | set(self.recvs)):
            src, dst, tag = key
            sends, recvs = self.sends.get(key, []), self.recvs.get(key, [])
            for (ssize, sid), (rsize, rid) in zip(sends, recvs):
                if ssize != rsize:
                    self.add("error", "p2p-size", f"{prefix}.{src}.et: node {sid} sends {ssize} B to rank {dst} "
                             f"tag {tag}, but the matching receive ({prefix}.{dst}.et node {rid}) expects {rsize} B")
            for ssize, sid in sends[len(recvs):]:
                self.add("error", "p2p-unmatched", f"{prefix}.{src}.et: node {sid} sends {ssize} B to rank {dst} "
                         f"tag {tag}, but rank {dst} has no COMM_RECV from rank {src} with that tag")
            for rsize, rid in recvs[len(sends):]:
                self.add("error", "p2p-unmatched", f"{prefix}.{dst}.et: node {rid} receives {rsize} B from rank "
                         f"{src} tag {tag}, but rank {src} has no COMM_SEND to rank {dst} with that tag")


def _find_rank_files(directory: Path, prefix: str) -> dict[int, Path]:
    """``{rank: path}`` for ``<prefix>.<rank>.et``; a ConfigError naming other prefixes if none match."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.et$")
    files: dict[int, Path] = {}
    others: set[str] = set()
    with os.scandir(directory) as it:
        for entry in it:
            m = pattern.match(entry.name)
            if m:
                if len(m.group(1)) > 8 or int(m.group(1)) >= MAX_GPUS:
                    raise ConfigError(f"{directory}: {shorten(entry.name)} names a rank at or above {MAX_GPUS:.0e}, "
                                      "the bound on GPUs; remove it or check the file names")
                files[int(m.group(1))] = Path(entry.path)
            elif entry.name.endswith(".et"):
                others.add(entry.name.rsplit(".", 2)[0])
    if not files:
        hint = f"; found prefix(es) {sorted(others)[:5]}, pass that prefix" if others else ""
        raise ConfigError(f"{directory}: no trace files named {prefix}.<rank>.et{hint}")
    return files


def _group_file(directory: Path, prefix: str) -> Path | None:
    """The comm-group file: ``comm_groups.json`` or ``<prefix>.json`` (STAGE's name)."""
    for name in ("comm_groups.json", f"{prefix}.json"):
        if (directory / name).is_file():
            return directory / name
    return None


def _load_groups(path: Path | None, world: int, merge_add: list[tuple[str, str, str]]) -> dict[int, list[int]]:
    """Read the group file, turning its problems into findings (the traces are still checked)."""
    if path is None:
        return {}
    try:
        groups = read_comm_groups(path)
    except ConfigError as err:
        merge_add.append(("error", "group-file", str(err)))
        return {}
    for gid, ranks in groups.items():
        bad = [r for r in ranks if r >= world]
        if bad:
            merge_add.append(("error", "group-file", f"{path.name}: group {gid} has rank(s) {bad}, but the "
                              f"highest rank file is {world - 1}"))
    return groups


def _results(ctx: CheckContext, files: dict[int, Path], workers: int, full: list[int],
             by_class: bool) -> Iterator[FileResult]:
    """File results in rank order, by symmetric class; contiguous blocks of ranks per worker when ``workers > 1``.

    ``full`` collects how many files each block checked in full (the rest were projected).
    """
    items = [(r, files[r]) for r in sorted(files)]
    check = partial(check_ranks, ctx, by_class=by_class)
    if workers <= 1 or len(items) < 2 * workers:
        results, checked = check(items)
        full.append(checked)
        yield from results
        return
    size = -(-len(items) // workers)
    blocks = [items[i:i + size] for i in range(0, len(items), size)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for results, checked in pool.map(check, blocks):
            full.append(checked)
            yield from results


def _check_counts(max_per_kind: int, workers: int) -> None:
    if max_per_kind < 1:
        raise ConfigError(f"max_per_kind={max_per_kind}; it must be at least 1")
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers={workers}; give 1 to {MAX_WORKERS} processes")


def validate_trace_dir(
    directory: os.PathLike | str,
    prefix: str = "workload",
    *,
    comm_groups: os.PathLike | str | None = None,
    max_per_kind: int = 20,
    strict_order: bool = False,
    workers: int = 1,
    by_class: bool = True,
) -> ValidationReport:
    """Validate ``<directory>/<prefix>.<rank>.et`` and its comm-group file (rules: module docstring).

    ``comm_groups`` overrides the file looked up as ``comm_groups.json`` or
    ``<prefix>.json``; ``workers`` checks files in that many processes.
    ``by_class=False`` checks every file node by node instead of one per
    symmetric class (same report, slower; see stageopt.chakra._rank_classes).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"trace directory {directory} does not exist or is not a directory")
    if comm_groups is not None and not Path(comm_groups).is_file():
        raise ConfigError(f"comm-group file {comm_groups} does not exist; omit it to use {directory}/{prefix}.json")
    _check_counts(max_per_kind, workers)
    files = _find_rank_files(directory, prefix)
    world = max(files) + 1
    groups_path = Path(comm_groups) if comm_groups is not None else _group_file(directory, prefix)
    group_findings: list[tuple[str, str, str]] = []
    groups = _load_groups(groups_path, world, group_findings)
    member_of: dict[int, list[int]] = defaultdict(list)
    for gid, ranks in groups.items():
        for r in ranks:
            member_of[r].append(gid)
    source = groups_path.name if groups_path else f"any comm-group file (none found: comm_groups.json, {prefix}.json)"
    ctx = CheckContext(
        world=world, prefix=prefix, groups=groups, member_of={r: tuple(g) for r, g in member_of.items()},
        groups_source=source, per_kind=max_per_kind, strict_order=strict_order,
    )
    merge = _Merge(ctx, files)
    for finding in group_findings:
        merge.add(*finding)
    full: list[int] = []
    for res in _results(ctx, files, workers, full, by_class):
        merge.file(res)
    merge.finish()
    n_err = sum(k for key, k in merge.counts.items() if key.startswith("error:"))
    n_warn = sum(k for key, k in merge.counts.items() if key.startswith("warning:"))
    return ValidationReport(
        ok=n_err == 0,
        violations=merge.errors,
        warnings=merge.warnings,
        n_files=len(files),
        n_nodes=merge.n_nodes,
        n_violations=n_err,
        n_warnings=n_warn,
        node_counts=dict(sorted(merge.node_counts.items())),
        finding_counts=dict(sorted(merge.counts.items())),
        comm_group_file=str(groups_path) if groups_path else None,
        n_full_checks=sum(full),
    )
