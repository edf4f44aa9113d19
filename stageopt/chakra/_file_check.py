"""Checks on one rank's trace file, independent of every other file.

Kept apart from the cross-rank checks so files can be checked in worker
processes: a check returns a small picklable :class:`FileResult` (findings,
per-group collective digests, point-to-point records) that the caller merges.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stageopt.chakra.attrs import INTEGER_ONEOFS
from stageopt.chakra.et_schema import SCHEMA_VERSION, CommType, NodeType
from stageopt.chakra.io import Trace, read_trace
from stageopt.errors import ConfigError

# Collective types ASTRA-sim simulates (BROADCAST is replayed from duration_micros); others abort.
SIMULATED_COLLECTIVES = frozenset(
    {CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.ALL_TO_ALL, CommType.BROADCAST}
)
ALL_RANKS = 0  # group key for a collective without pg_name ("" or "0")
ORDER_KINDS = frozenset({"order-ids", "order-deps"})

_COMP = int(NodeType.COMP_NODE)
_COLL = int(NodeType.COMM_COLL_NODE)
_SEND = int(NodeType.COMM_SEND_NODE)
_RECV = int(NodeType.COMM_RECV_NODE)
_TYPE_NAMES = {int(t): t.name for t in NodeType}
_BAD_TYPES = {int(NodeType.METADATA_NODE), int(NodeType.INVALID_NODE)}


@dataclass(frozen=True)
class CheckContext:
    """What a file check needs to know about the whole set (picklable)."""

    world: int
    prefix: str
    groups: dict[int, list[int]]
    member_of: dict[int, tuple[int, ...]]
    groups_source: str
    per_kind: int
    strict_order: bool


@dataclass(frozen=True)
class Coll:
    """One collective as the cross-rank comparison sees it."""

    node_id: int
    group: int
    comm_type: int
    size: int

    def describe(self) -> str:
        name = _comm_name(self.comm_type)
        return f"{name} of {self.size} B (node {self.node_id})"


@dataclass
class FileResult:
    """Everything one file contributes to the report."""

    rank: int
    n_nodes: int = 0
    node_counts: Counter = field(default_factory=Counter)
    findings: list[tuple[str, str, str]] = field(default_factory=list)  # (level, kind, message)
    finding_counts: Counter = field(default_factory=Counter)  # "level:kind" -> count
    digests: dict[int, bytes] = field(default_factory=dict)  # group -> digest of its collective sequence
    group_use: dict[int, tuple[int, str]] = field(default_factory=dict)  # group -> (uses, first use)
    sends: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # src, dst, tag, size, node
    recvs: list[tuple[int, int, int, int, int]] = field(default_factory=list)


def _comm_name(value: int) -> str:
    try:
        return CommType(value).name
    except ValueError:
        return f"comm_type {value}"


def int_attr(attrs: dict[str, Any], name: str, *, allow_bool: bool = False) -> int | str | None:
    """An integer attribute's value, None if absent, or a string saying why it is unusable."""
    attr = attrs.get(name)
    if attr is None:
        return None
    oneof = attr.WhichOneof("value")
    if oneof not in INTEGER_ONEOFS and not (allow_bool and oneof == "bool_val"):
        return f"{name} is {oneof or 'unset'}, not an integer"
    return int(getattr(attr, oneof))


def group_key(pg_name: str) -> int | None:
    """Group id named by a pg_name string (0 = all ranks), None if not a plain integer."""
    if pg_name in ("", "0"):
        return ALL_RANKS
    return int(pg_name) if pg_name.isdigit() and pg_name == str(int(pg_name)) else None


def digest(seq: list[Coll]) -> bytes:
    """Fingerprint of a (type, size) sequence; groups compare these instead of keeping sequences."""
    flat = array("q")
    for c in seq:
        flat.append(c.comm_type)
        flat.append(c.size)
    return hashlib.blake2b(flat.tobytes(), digest_size=16).digest()


def find_cycle(ids: list[int], deps: dict[int, list[int]]) -> list[int] | None:
    """One dependency cycle as a list of ids (first == last), or None if acyclic."""
    indeg = dict.fromkeys(ids, 0)
    users: dict[int, list[int]] = defaultdict(list)
    for nid, ds in deps.items():
        for d in ds:
            if d in indeg:
                indeg[nid] += 1
                users[d].append(nid)
    ready = [nid for nid, k in indeg.items() if k == 0]
    while ready:
        nid = ready.pop()
        for u in users.get(nid, ()):
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    stuck = {nid for nid, k in indeg.items() if k > 0}
    if not stuck:
        return None
    # Every stuck node has a stuck dependency; follow them until one repeats.
    node = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = min(d for d in deps[node] if d in stuck)
    return path[seen[node] :] + [node]


def collectives(nodes: list[Any]) -> list[Coll]:
    """Well-formed collectives of a file in node-id order (ASTRA-sim issues ready nodes by ascending id)."""
    out = []
    for n in nodes:
        if n.type != _COLL:
            continue
        attrs = {a.name: a for a in n.attr}
        pg = attrs["pg_name"].string_val if "pg_name" in attrs else ""
        gid = group_key(pg)
        ctype, size = int_attr(attrs, "comm_type"), int_attr(attrs, "comm_size")
        if gid is not None and isinstance(ctype, int) and isinstance(size, int):
            out.append(Coll(n.id, gid, ctype, size))
    out.sort(key=lambda c: c.node_id)
    return out


class _Checker:
    """Runs the per-file rules, recording findings into a FileResult."""

    def __init__(self, ctx: CheckContext, rank: int, fname: str) -> None:
        self.ctx = ctx
        self.rank = rank
        self.fname = fname
        self.res = FileResult(rank=rank)
        self.colls: list[Coll] = []

    def add(self, level: str, kind: str, message: str) -> None:
        if level == "warning" and self.ctx.strict_order and kind in ORDER_KINDS:
            level = "error"
        key = f"{level}:{kind}"
        self.res.finding_counts[key] += 1
        if self.res.finding_counts[key] <= self.ctx.per_kind:
            self.res.findings.append((level, kind, message))

    def where(self, node: Any) -> str:
        return f"{self.fname}: node {node.id} ({node.name!r})"

    def require_ints(self, node: Any, attrs: dict[str, Any], names: tuple[str, ...], kind: str) -> list[Any]:
        """Report missing or non-integer attributes; returns each value (int, None or a reason)."""
        values = [int_attr(attrs, n) for n in names]
        if not all(isinstance(v, int) for v in values):
            missing = [n for n, v in zip(names, values) if v is None]
            if missing:
                self.add("error", kind, f"{self.where(node)}: missing attribute(s) {', '.join(missing)}")
            for v in values:
                if isinstance(v, str):
                    self.add("error", kind, f"{self.where(node)}: {v}")
        return values

    def group_of(self, node: Any, attrs: dict[str, Any]) -> int | None:
        """Resolve a collective's pg_name to a group id, reporting bad names."""
        attr = attrs.get("pg_name")
        if attr is None:
            return ALL_RANKS
        oneof = attr.WhichOneof("value")
        if oneof != "string_val":
            self.add("error", "pg-name", f"{self.where(node)}: pg_name is {oneof or 'unset'}; ASTRA-sim needs a string_val")
            return None
        gid = group_key(attr.string_val)
        if gid == ALL_RANKS:
            return gid
        groups = self.ctx.groups
        if gid is None or gid not in groups:
            self.add("error", "pg-name", f"{self.where(node)}: pg_name {attr.string_val!r} names no group in {self.ctx.groups_source}")
            return None
        uses, first = self.res.group_use.get(gid, (0, self.where(node)))
        self.res.group_use[gid] = (uses + 1, first)
        if self.rank not in groups[gid]:
            self.add("error", "pg-name", f"{self.where(node)}: rank {self.rank} issues a collective on group {gid} "
                     f"{groups[gid]}, which it is not a member of")
            return None
        return gid

    def node(self, node: Any) -> None:
        ntype = node.type
        tname = _TYPE_NAMES.get(ntype)
        self.res.node_counts[tname or f"UNKNOWN({ntype})"] += 1
        if tname is None or ntype in _BAD_TYPES:
            self.add("error", "node-type", f"{self.where(node)}: {tname or f'unknown type {ntype}'} in the node "
                     "stream; ASTRA-sim aborts on it")
            return
        if ntype == _COMP:
            attrs = {a.name: a for a in node.attr}
            self.require_ints(node, attrs, ("num_ops", "tensor_size"), "comp-attrs")
            if int_attr(attrs, "is_cpu_op", allow_bool=True) == 1:
                self.add("warning", "cpu-op", f"{self.where(node)}: COMP node with is_cpu_op true breaks "
                         "ASTRA-sim's statistics report")
        elif ntype == _COLL:
            self.collective(node, {a.name: a for a in node.attr})
        elif ntype in (_SEND, _RECV):
            self.p2p(node, {a.name: a for a in node.attr})

    def collective(self, node: Any, attrs: dict[str, Any]) -> None:
        ctype, size = self.require_ints(node, attrs, ("comm_type", "comm_size"), "coll-attrs")
        if isinstance(ctype, int) and ctype not in SIMULATED_COLLECTIVES:
            self.add("error", "coll-attrs", f"{self.where(node)}: {_comm_name(ctype)} is not simulated by ASTRA-sim "
                     "(it aborts); use ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL or BROADCAST")
            return
        gid = self.group_of(node, attrs)
        if isinstance(ctype, int) and isinstance(size, int) and gid is not None:
            self.colls.append(Coll(node.id, gid, ctype, size))

    def p2p(self, node: Any, attrs: dict[str, Any]) -> None:
        is_send = node.type == _SEND
        peer_attr = "comm_dst" if is_send else "comm_src"
        peer, tag, size = self.require_ints(node, attrs, (peer_attr, "comm_tag", "comm_size"), "p2p-attrs")
        if not (isinstance(peer, int) and isinstance(tag, int) and isinstance(size, int)):
            return
        if not 0 <= peer < self.ctx.world or peer == self.rank:
            self.add("error", "p2p-attrs", f"{self.where(node)}: {peer_attr} {peer} is not another rank "
                     f"(0..{self.ctx.world - 1}, this is rank {self.rank})")
            return
        if is_send:
            self.res.sends.append((self.rank, peer, tag, size, node.id))
        else:
            self.res.recvs.append((peer, self.rank, tag, size, node.id))

    def graph(self, nodes: list[Any]) -> None:
        """Ids, dependencies, ordering and cycles."""
        position: dict[int, int] = {}
        for pos, node in enumerate(nodes):
            if node.id in position:
                self.add("error", "duplicate-id", f"{self.fname}: node id {node.id} appears more than once")
            position[node.id] = pos
        deps: dict[int, list[int]] = {}
        backward = 0
        first_backward = (0, 0)
        for pos, node in enumerate(nodes):
            ds = list(node.data_deps)
            ds.extend(node.ctrl_deps)
            deps[node.id] = ds
            nid = node.id
            for d in ds:
                dpos = position.get(d)
                if dpos is None:
                    self.add("error", "missing-dep", f"{self.where(node)}: depends on id {d}, which is not in the file")
                elif d >= nid or dpos > pos:
                    if not backward:
                        first_backward = (nid, d)
                    backward += 1
        ids = [n.id for n in nodes]
        if ids != list(range(len(ids))):
            self.add("warning", "order-ids", f"{self.fname}: node ids are not 0..{len(ids) - 1} in file order "
                     f"(min {min(ids, default=0)}, max {max(ids, default=0)}, {len(ids)} nodes"
                     f"{', ascending' if ids == sorted(ids) else ', not ascending'})")
        if backward:
            self.add("warning", "order-deps", f"{self.fname}: {backward} dependencies point to a larger id or a "
                     f"later node (first: node {first_backward[0]} depends on {first_backward[1]}); not in "
                     "topological order")
        cycle = find_cycle(ids, deps)
        if cycle:
            self.add("error", "cycle", f"{self.fname}: dependency cycle {' -> '.join(map(str, cycle))}")

    def sequences(self) -> None:
        """Digest of this rank's collective sequence on every group it belongs to (empty ones too)."""
        by_group: dict[int, list[Coll]] = defaultdict(list)
        for c in sorted(self.colls, key=lambda c: c.node_id):
            by_group[c.group].append(c)
        for gid in (ALL_RANKS, *self.ctx.member_of.get(self.rank, ())):
            self.res.digests[gid] = digest(by_group.get(gid, []))


def check_trace(ctx: CheckContext, rank: int, fname: str, trace: Trace) -> FileResult:
    """All single-file rules for one decoded rank file (see stageopt.chakra.validate for the list)."""
    checker = _Checker(ctx, rank, fname)
    if trace.version != SCHEMA_VERSION:
        checker.add("warning", "version", f"{fname}: metadata version {trace.version!r}, expected {SCHEMA_VERSION!r}")
    checker.res.n_nodes = len(trace.nodes)
    checker.graph(trace.nodes)
    for node in trace.nodes:
        checker.node(node)
    checker.sequences()
    return checker.res


def decode_error(ctx: CheckContext, rank: int, fname: str, err: ConfigError) -> FileResult:
    """The result of a file that cannot be read or decoded."""
    checker = _Checker(ctx, rank, fname)
    checker.add("error", "decode", str(err))
    return checker.res


def check_file(ctx: CheckContext, rank: int, path: Path) -> FileResult:
    """Read, decode and check one rank's file."""
    try:
        trace = read_trace(path)
    except ConfigError as err:
        return decode_error(ctx, rank, path.name, err)
    return check_trace(ctx, rank, path.name, trace)
