"""Check a trace set by symmetric classes: one representative file per class, the others projected.

Why: all ranks of a pipeline stage run one program; their files differ only in
the rank-specific attributes ``pg_name``, ``comm_src``, ``comm_dst`` and
``comm_tag`` (see :mod:`stageopt.chakra.template`). Decoding and checking
every node of 32,768 files takes minutes in Python; finding the class of a
file takes one regular-expression split in C.

A file's class key is its bytes with every rank-specific attribute record cut
out, plus the lengths of all pieces, so two files share a key only if they are
byte-identical apart from same-length rank-specific records at the same
places. The first file of a class (its representative) is decoded and checked
in full. It becomes a template for the others only if

* the records the split found are exactly the rank-specific attributes its
  nodes hold (same multiset of serialized records: nothing was cut from inside
  a name or another value, and none was missed), and
* every finding it produced is about the file alone (not about groups or peers).

A member of such a class maps the representative's record values one-to-one
to its own (a substitution, as the template applies). Its result is then the
representative's, with group ids, peers and tags renamed and its own group
memberships and peers checked. A member that is not such a substitution, or
whose groups or peers are wrong, is checked in full, so every finding is the
same as a file-by-file check would give.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from stageopt.chakra._file_check import (
    ALL_RANKS,
    CheckContext,
    FileResult,
    check_trace,
    decode_error,
    digest,
    group_key,
)
from stageopt.chakra.attrs import attr_value
from stageopt.chakra.et_schema import AttributeProto
from stageopt.chakra.io import decode_trace
from stageopt.chakra.template import RANK_SPECIFIC_ATTRS
from stageopt.errors import ConfigError

_MAX_PG_LEN = 20


def _record_pattern() -> re.Pattern[bytes]:
    """The body of an AttributeProto for a rank-specific attribute, exactly as the writer encodes it.

    ``pg_name`` as ``string_val`` (field 29, tag ``ea 01``) of up to 20 bytes;
    ``comm_src``/``comm_dst``/``comm_tag`` as ``int32_val`` (tag ``38``) or
    ``int64_val`` (tag ``48``) varints. Other encodings are not cut out, so
    their files simply fall into classes of their own.
    """
    strings = b"|".join(re.escape(bytes([n])) + (rb"[\x00-\xff]{%d}" % n if n else b"")
                        for n in range(_MAX_PG_LEN + 1))
    pg = re.escape(b"\x0a\x07pg_name\xea\x01") + b"(?:" + strings + b")"
    comm = rb"\x0a\x08comm_(?:src|dst|tag)[\x38\x48][\x80-\xff]{0,9}[\x00-\x7f]"
    return re.compile(b"(" + pg + b"|" + comm + b")", re.DOTALL)


_RECORD = _record_pattern()
_HEAD = 11  # bytes of a record that hold its attribute name and value type
_EMPTY = digest([])
_RANK_KINDS = frozenset({"pg-name", "p2p-attrs"})  # findings that depend on the rank's own values


def split_records(data: bytes) -> tuple[bytes, list[bytes]]:
    """(class key, the rank-specific records in file order) of one file's bytes."""
    parts = _RECORD.split(data)
    pieces, records = parts[0::2], parts[1::2]
    shape = array("I", map(len, pieces))
    shape.extend(map(len, records))
    return b"".join(pieces) + shape.tobytes(), records


@dataclass
class _Class:
    rank: int
    fname: str
    result: FileResult
    records: list[bytes]
    distinct: int
    template: bool


class RankClassifier:
    """Checks the files of one worker: full checks for representatives, projections for the rest."""

    def __init__(self, ctx: CheckContext, *, by_class: bool = True) -> None:
        self.ctx = ctx
        self.by_class = by_class
        self.classes: dict[bytes, _Class] = {}
        self.values: dict[bytes, tuple[str, object]] = {}  # record -> (attribute name, value)
        self.full_checks = 0

    def check(self, rank: int, path: Path) -> FileResult:
        """The same FileResult a full check of ``path`` gives."""
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as err:
            return decode_error(self.ctx, rank, path.name, ConfigError(f"cannot read trace {path}: {err.strerror}"))
        key, records = split_records(data)
        known = self.classes.get(key)
        if known is not None and known.template and self.by_class:
            projected = self._project(known, rank, path.name, records)
            if projected is not None:
                return projected
        result, template = self._full(rank, path, data, records)
        if known is None:
            self.classes[key] = _Class(rank, path.name, result, records, len(set(records)), template)
        return result

    def _full(self, rank: int, path: Path, data: bytes, records: list[bytes]) -> tuple[FileResult, bool]:
        self.full_checks += 1
        try:
            trace = decode_trace(data, path)
        except ConfigError as err:
            return decode_error(self.ctx, rank, path.name, err), False
        result = check_trace(self.ctx, rank, path.name, trace)
        held = Counter(a.SerializeToString(deterministic=True) for n in trace.nodes for a in n.attr
                       if a.name in RANK_SPECIFIC_ATTRS)
        own = f"{path.name}:"
        template = (held == Counter(records)
                    and all(kind not in _RANK_KINDS and msg.startswith(own) for _, kind, msg in result.findings)
                    and not any(key.split(":", 1)[1] in _RANK_KINDS for key in result.finding_counts))
        return result, template

    def _value(self, record: bytes) -> tuple[str, object]:
        """(name, value) of one record; DecodeError (e.g. a pg_name that is not UTF-8) goes to the caller."""
        found = self.values.get(record)
        if found is None:
            attr = AttributeProto.FromString(record)
            found = self.values[record] = (attr.name, attr_value(attr))
        return found

    def _renaming(self, cls: _Class, records: list[bytes]) -> dict[str, dict[object, object]] | None:
        """Per attribute, the one-to-one map from the representative's values to this file's, if there is one."""
        pairs = set(zip(cls.records, records))
        if len(pairs) != cls.distinct or len({m for _, m in pairs}) != cls.distinct:
            return None
        maps: dict[str, dict[object, object]] = {name: {} for name in RANK_SPECIFIC_ATTRS}
        try:
            for old, new in pairs:
                if old[:_HEAD] != new[:_HEAD]:
                    return None
                name, value = self._value(old)
                maps[name][value] = self._value(new)[1]
        except DecodeError:
            return None  # the full check names the file and offset
        return maps

    def _project(self, cls: _Class, rank: int, fname: str, records: list[bytes]) -> FileResult | None:
        """This file's result from its representative's, or None when it must be checked in full."""
        maps = self._renaming(cls, records)
        if maps is None:
            return None
        groups = self._group_map(maps["pg_name"], rank)
        if groups is None:
            return None
        rep = cls.result
        res = FileResult(rank=rank, n_nodes=rep.n_nodes, node_counts=rep.node_counts,
                         finding_counts=rep.finding_counts)
        res.findings = [(level, kind, fname + msg[len(cls.fname):]) for level, kind, msg in rep.findings]
        res.digests = {groups.get(g, g): d for g, d in rep.digests.items() if g == ALL_RANKS or g in groups}
        for gid in self.ctx.member_of.get(rank, ()):
            res.digests.setdefault(gid, _EMPTY)
        res.group_use = {groups[g]: (uses, fname + first[len(cls.fname):]) for g, (uses, first) in rep.group_use.items()}
        try:
            res.sends = [(rank, self._peer(maps["comm_dst"][dst], rank), maps["comm_tag"][tag], size, nid)
                         for _, dst, tag, size, nid in rep.sends]
            res.recvs = [(self._peer(maps["comm_src"][src], rank), rank, maps["comm_tag"][tag], size, nid)
                         for src, _, tag, size, nid in rep.recvs]
        except (KeyError, ValueError):
            return None
        return res

    def _group_map(self, names: dict[object, object], rank: int) -> dict[int, int] | None:
        """Representative group id -> this rank's, if every renamed group exists and holds this rank."""
        out: dict[int, int] = {}
        for old, new in names.items():
            if not isinstance(old, str) or not isinstance(new, str):
                return None
            a, b = group_key(old), group_key(new)
            if a is None or b is None or (a == ALL_RANKS) != (b == ALL_RANKS):
                return None
            if b != ALL_RANKS and (b not in self.ctx.groups or rank not in self.ctx.groups[b]):
                return None
            if a != ALL_RANKS:
                out[a] = b
        return out

    def _peer(self, peer: object, rank: int) -> int:
        if not isinstance(peer, int) or not 0 <= peer < self.ctx.world or peer == rank:
            raise ValueError(peer)
        return peer


def check_ranks(ctx: CheckContext, items: list[tuple[int, Path]], *, by_class: bool = True,
                ) -> tuple[list[FileResult], int]:
    """Results for ``(rank, path)`` items in order, and how many files needed a full check (a worker's job).

    ``by_class=False`` checks every file in full (the reference the projection must equal).
    """
    classifier = RankClassifier(ctx, by_class=by_class)
    results = [classifier.check(rank, path) for rank, path in items]
    return results, classifier.full_checks
