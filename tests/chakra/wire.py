"""A tiny protobuf wire-format reader, independent of stageopt's schema and of protobuf.

Used to cross-check stageopt's reader: it knows only varints and the four wire
types, so a wrong field number or type in the schema shows up as a mismatch.
"""

from __future__ import annotations

import struct


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def records(buf: bytes) -> list[bytes]:
    """Split a length-delimited stream into message bodies."""
    out, pos = [], 0
    while pos < len(buf):
        size, pos = varint(buf, pos)
        out.append(buf[pos : pos + size])
        pos += size
    return out


def fields(msg: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, raw value) for each field of one message."""
    out, pos = [], 0
    while pos < len(msg):
        key, pos = varint(msg, pos)
        number, wtype = key >> 3, key & 7
        if wtype == 0:
            value, pos = varint(msg, pos)
        elif wtype == 1:
            value, pos = struct.unpack_from("<Q", msg, pos)[0], pos + 8
        elif wtype == 2:
            size, pos = varint(msg, pos)
            value, pos = msg[pos : pos + size], pos + size
        elif wtype == 5:
            value, pos = struct.unpack_from("<I", msg, pos)[0], pos + 4
        else:
            raise ValueError(f"wire type {wtype}")
        out.append((number, wtype, value))
    return out


def node_summary(msg: bytes) -> tuple[int, int, dict[str, int]]:
    """(id, type, {attribute name: oneof field number}) of one Node body."""
    nid = ntype = 0
    attrs: dict[str, int] = {}
    for number, _, value in fields(msg):
        if number == 1:
            nid = value
        elif number == 3:
            ntype = value
        elif number == 10:
            name, member = "", 0
            for n2, _, v2 in fields(value):
                if n2 == 1:
                    name = v2.decode()
                elif n2 >= 3:
                    member = n2
            attrs[name] = member
    return nid, ntype, attrs
