"""Writing many ranks' traces from one serialized stage program.

All ranks of a pipeline stage run the same program; only communicator ids
(``pg_name``) and point-to-point peers and tags (``comm_src``, ``comm_dst``,
``comm_tag``) differ. :class:`TraceTemplate` serializes the nodes once, keeps
every node without such an attribute as ready-made bytes, and for the others
keeps the bytes around each rank-specific attribute. Rendering a rank then
encodes only the few distinct substituted attributes and splices them in, so
the cost per rank is a join over the patched nodes, not a protobuf encode of
the whole graph.

Patches substitute by value: the template is built with placeholder values
(e.g. ``pg_name="tp"``, ``comm_dst=-1``) and each rank maps them to its own,
``{"pg_name": {"tp": "17", "dp": "3"}, "comm_dst": {-1: 12}}``. A value with no
entry stays as it is. The result is byte-identical to :func:`write_trace` on
the nodes with those substitutions applied.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from stageopt.chakra.attrs import AttrValue, attr_value, make_attr
from stageopt.chakra.et_schema import SCHEMA_VERSION
from stageopt.chakra.io import delimited, encode_varint, metadata_bytes
from stageopt.errors import ConfigError

RANK_SPECIFIC_ATTRS: tuple[str, ...] = ("pg_name", "comm_src", "comm_dst", "comm_tag")

_ATTR_TAG = b"\x52"  # field 10 (Node.attr), wire type 2 (length-delimited)

Patches = Mapping[str, Mapping[Any, AttrValue]]
_SlotKey = tuple[str, str, Any]  # (attribute name, oneof member, template value)


def _attr_record(attr: Any) -> bytes:
    """One attribute as it appears inside a serialized Node (tag, length, body)."""
    raw = attr.SerializeToString(deterministic=True)
    return _ATTR_TAG + encode_varint(len(raw)) + raw


class TraceTemplate:
    """A stage program serialized once, rendered per rank by substituting rank-specific attributes."""

    __slots__ = ("_static", "_patched", "_slot_keys", "_patchable")

    def __init__(
        self,
        nodes: Iterable[Any],
        *,
        version: str = SCHEMA_VERSION,
        patchable: Iterable[str] = RANK_SPECIFIC_ATTRS,
    ) -> None:
        self._patchable = frozenset(patchable)
        slot_index: dict[_SlotKey, int] = {}
        # _static[i] is the run of fixed bytes before patched node i (the last one after all).
        self._static: list[bytes] = []
        # per patched node: (fixed pieces around the slots, slot indices, fixed length)
        self._patched: list[tuple[tuple[bytes, ...], tuple[int, ...], int]] = []
        run: list[bytes] = [metadata_bytes(version)]
        for node in nodes:
            if not any(a.name in self._patchable and a.WhichOneof("value") for a in node.attr):
                run.append(delimited(node))
                continue
            self._static.append(b"".join(run))
            run = []
            self._patched.append(self._split(node, slot_index))
        self._static.append(b"".join(run))
        self._slot_keys: list[_SlotKey] = list(slot_index)

    def _split(self, node: Any, slot_index: dict[_SlotKey, int]) -> tuple[tuple[bytes, ...], tuple[int, ...], int]:
        """Cut a node's bytes into fixed pieces and rank-specific attribute slots."""
        bare = type(node)()
        bare.CopyFrom(node)
        del bare.attr[:]
        pieces: list[bytes] = []
        current = [bare.SerializeToString(deterministic=True)]
        slots: list[int] = []
        for attr in node.attr:
            oneof = attr.WhichOneof("value")
            if attr.name in self._patchable and oneof:
                key = (attr.name, oneof, attr_value(attr))
                slots.append(slot_index.setdefault(key, len(slot_index)))
                pieces.append(b"".join(current))
                current = []
            else:
                current.append(_attr_record(attr))
        pieces.append(b"".join(current))
        # The splice is only valid if attr is the last field on the wire (true
        # for every Node of this schema; a foreign node with unknown fields is not).
        whole = node.SerializeToString(deterministic=True)
        rebuilt = [pieces[0]]
        for i, attr in enumerate(a for a in node.attr if a.name in self._patchable and a.WhichOneof("value")):
            rebuilt += (_attr_record(attr), pieces[i + 1])
        if b"".join(rebuilt) != whole:
            raise ConfigError(
                f"node {node.id} ({node.name!r}) has fields outside the Chakra v0.0.4 schema; "
                "build nodes with stageopt.chakra.make_node"
            )
        return tuple(pieces), tuple(slots), sum(map(len, pieces))

    @property
    def placeholders(self) -> dict[str, list[AttrValue]]:
        """Template values of each rank-specific attribute, i.e. the keys a patch may map."""
        out: dict[str, list[AttrValue]] = {}
        for name, _, value in self._slot_keys:
            out.setdefault(name, []).append(value)
        return out

    def _encoded_slots(self, patches: Patches) -> list[bytes]:
        """The attribute record for each distinct slot after substitution."""
        unknown = set(patches) - self._patchable
        if unknown:
            raise ConfigError(
                f"patches name attribute(s) {sorted(unknown)} that the template does not treat as "
                f"rank-specific; patchable: {sorted(self._patchable)}"
            )
        out = []
        for name, oneof, value in self._slot_keys:
            mapping = patches.get(name)
            new = mapping.get(value, value) if mapping else value
            out.append(_attr_record(make_attr(name, new, oneof)))
        return out

    def render(self, patches: Patches) -> bytes:
        """The whole ``.et`` file for one rank, with ``patches`` substituted."""
        enc = self._encoded_slots(patches)
        static = self._static
        parts: list[bytes] = [static[0]]
        append = parts.append
        varints: dict[int, bytes] = {}
        for i, (pieces, slots, fixed) in enumerate(self._patched):
            if len(slots) == 1:
                rec = enc[slots[0]]
                size = fixed + len(rec)
                head = varints.get(size)
                if head is None:
                    head = varints[size] = encode_varint(size)
                parts += (head, pieces[0], rec, pieces[1])
            else:
                recs = [enc[s] for s in slots]
                size = fixed + sum(map(len, recs))
                append(encode_varint(size))
                append(pieces[0])
                for rec, piece in zip(recs, pieces[1:]):
                    append(rec)
                    append(piece)
            append(static[i + 1])
        return b"".join(parts)

    def write(self, path: os.PathLike | str, patches: Patches) -> None:
        """Render and write one rank's file."""
        data = self.render(patches)
        try:
            with open(path, "wb") as fh:
                fh.write(data)
        except OSError as err:
            raise ConfigError(f"cannot write trace {path}: {err.strerror}") from err
