"""Reading and writing Chakra ET files: varint-length-delimited protobuf streams.

A file is ``GlobalMetadata`` followed by ``Node`` messages, each prefixed by its
byte length as a varint. Serialization uses protobuf's deterministic mode so the
same nodes always give the same bytes (traces are compared and cached by hash).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from stageopt.chakra.attrs import AttrValue, make_attr
from stageopt.chakra.et_schema import SCHEMA_VERSION, GlobalMetadata, Node, NodeType
from stageopt.errors import ConfigError


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128, the length prefix protobuf's delimited streams use."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decode_varint(buf: bytes, pos: int, path: os.PathLike | str) -> tuple[int, int]:
    """Decode one length prefix at ``pos``; returns (value, position after it)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= len(buf):
            raise ConfigError(f"{path}: truncated length prefix at byte {start}; the file is cut short or not a Chakra ET file")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ConfigError(f"{path}: malformed length prefix at byte {start}; not a Chakra ET file")


def iter_messages(buf: bytes, path: os.PathLike | str = "<bytes>") -> Iterator[tuple[int, bytes]]:
    """Yield (byte offset, message bytes) for each delimited message in ``buf``."""
    pos = 0
    end = len(buf)
    while pos < end:
        size, body = _decode_varint(buf, pos, path)
        if body + size > end:
            raise ConfigError(
                f"{path}: message at byte {pos} declares {size} bytes but only {end - body} remain; "
                "the file is truncated"
            )
        yield pos, buf[body : body + size]
        pos = body + size


@dataclass(frozen=True)
class Trace:
    """One decoded ET file: the metadata version and the nodes in file order."""

    version: str
    nodes: list


def _parse(cls: type, raw: bytes, path: os.PathLike | str, offset: int) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(raw)
    except DecodeError as err:
        raise ConfigError(f"{path}: cannot decode {cls.__name__} at byte {offset} ({err}); not a Chakra ET v0.0.4 file") from err
    return msg


def decode_trace(buf: bytes, path: os.PathLike | str = "<bytes>") -> Trace:
    """Decode a whole ET byte stream (see :func:`read_trace`)."""
    messages = iter_messages(buf, path)
    first = next(messages, None)
    if first is None:
        raise ConfigError(f"{path}: empty file; a Chakra ET file starts with a GlobalMetadata message")
    meta = _parse(GlobalMetadata, first[1], path, first[0])
    nodes = [_parse(Node, raw, path, off) for off, raw in messages]
    return Trace(version=meta.version, nodes=nodes)


def read_trace(path: os.PathLike | str) -> Trace:
    """Read one ``<prefix>.<rank>.et`` file; errors name the file and byte offset."""
    try:
        with open(path, "rb") as fh:
            buf = fh.read()
    except OSError as err:
        raise ConfigError(f"cannot read trace {path}: {err.strerror}") from err
    return decode_trace(buf, path)


def make_node(
    id: int,  # noqa: A002 - the Chakra field is called id
    name: str,
    type: NodeType | int,  # noqa: A002 - the Chakra field is called type
    *,
    ctrl_deps: Iterable[int] = (),
    data_deps: Iterable[int] = (),
    duration_micros: int = 0,
    **attrs: AttrValue,
) -> Any:
    """Build a ``Node``; each keyword becomes an attribute with the oneof ASTRA-sim expects.

    Attributes keep keyword order, so the same call always serializes to the
    same bytes. ``duration_micros`` is the node field (used by ASTRA-sim when
    the roofline is off and for BROADCAST), not an attribute.
    """
    try:
        NodeType(int(type))
    except ValueError:
        raise ConfigError(f"node {id} ({name!r}): unknown node type {type!r}; use a stageopt.chakra.NodeType") from None
    node = Node(id=id, name=name, type=int(type), duration_micros=duration_micros)
    node.ctrl_deps.extend(ctrl_deps)
    node.data_deps.extend(data_deps)
    node.attr.extend(make_attr(k, v) for k, v in attrs.items())
    return node


def metadata_bytes(version: str = SCHEMA_VERSION) -> bytes:
    """The delimited GlobalMetadata record that opens every file."""
    raw = GlobalMetadata(version=version).SerializeToString(deterministic=True)
    return encode_varint(len(raw)) + raw


def delimited(node: Any) -> bytes:
    """One node as a length-prefixed record."""
    raw = node.SerializeToString(deterministic=True)
    return encode_varint(len(raw)) + raw


def encode_trace(nodes: Iterable[Any], version: str = SCHEMA_VERSION) -> bytes:
    """The full file contents for ``nodes`` (what :func:`write_trace` writes)."""
    parts = [metadata_bytes(version)]
    parts.extend(delimited(n) for n in nodes)
    return b"".join(parts)


def write_trace(path: os.PathLike | str, nodes: Iterable[Any], version: str = SCHEMA_VERSION) -> None:
    """Write GlobalMetadata then ``nodes`` in the given order; same input, same bytes."""
    data = encode_trace(nodes, version)
    try:
        with open(path, "wb") as fh:
            fh.write(data)
    except OSError as err:
        raise ConfigError(f"cannot write trace {path}: {err.strerror}") from err
