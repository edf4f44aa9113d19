"""Chakra execution-trace schema v0.0.4, built from descriptors in Python.

Why not a ``.proto`` file: building the ``FileDescriptorProto`` here needs no
``protoc`` step and no generated module to keep in sync; only the field
numbers, names and types have to match what ASTRA-sim's reader expects
(package ``ChakraProtoMsg``, messages ``GlobalMetadata``, ``Node``,
``AttributeProto``, ``IOInfo`` and the typed list messages).
"""

from __future__ import annotations

import enum

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMA_VERSION = "0.0.4"
PACKAGE = "ChakraProtoMsg"

_F = descriptor_pb2.FieldDescriptorProto


class NodeType(enum.IntEnum):
    """Values of the ``NodeType`` enum (field ``Node.type``)."""

    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CommType(enum.IntEnum):
    """Values of ``CollectiveCommType`` (the ``comm_type`` attribute)."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


# Typed values of AttributeProto's oneof, in field-number order starting at 3:
# each scalar ``<kind>_val`` is followed by its list message ``<Kind>List``.
# (kind, scalar field type, list message name)
_ATTR_KINDS: tuple[tuple[str, int, str], ...] = (
    ("double", _F.TYPE_DOUBLE, "DoubleList"),
    ("float", _F.TYPE_FLOAT, "FloatList"),
    ("int32", _F.TYPE_INT32, "Int32List"),
    ("int64", _F.TYPE_INT64, "Int64List"),
    ("uint32", _F.TYPE_UINT32, "Uint32List"),
    ("uint64", _F.TYPE_UINT64, "Uint64List"),
    ("sint32", _F.TYPE_SINT32, "Sint32List"),
    ("sint64", _F.TYPE_SINT64, "Sint64List"),
    ("fixed32", _F.TYPE_FIXED32, "Fixed32List"),
    ("fixed64", _F.TYPE_FIXED64, "Fixed64List"),
    ("sfixed32", _F.TYPE_SFIXED32, "Sfixed32List"),
    ("sfixed64", _F.TYPE_SFIXED64, "Sfixed64List"),
    ("bool", _F.TYPE_BOOL, "BoolList"),
    ("string", _F.TYPE_STRING, "StringList"),
    ("bytes", _F.TYPE_BYTES, "BytesList"),
)

# Field numbers of AttributeProto's typed oneof members, e.g. "int64_val" -> 9.
ATTR_FIELD_NUMBERS: dict[str, int] = {}
for _i, (_kind, _t, _list) in enumerate(_ATTR_KINDS):
    ATTR_FIELD_NUMBERS[f"{_kind}_val"] = 3 + 2 * _i
    ATTR_FIELD_NUMBERS[f"{_kind}_list"] = 4 + 2 * _i


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    ftype: int,
    *,
    repeated: bool = False,
    type_name: str | None = None,
    oneof_index: int | None = None,
) -> None:
    """Append one field; message and enum references use full names."""
    f = msg.field.add(name=name, number=number, type=ftype)
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name is not None:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof_index is not None:
        f.oneof_index = oneof_index


def _enum(fdp: descriptor_pb2.FileDescriptorProto, name: str, members: type[enum.IntEnum]) -> None:
    e = fdp.enum_type.add(name=name)
    for m in members:
        e.value.add(name=m.name, number=int(m))


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    """The whole schema as one proto3 file descriptor."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="stageopt/chakra/et_def_v0_0_4.proto", package=PACKAGE, syntax="proto3"
    )
    attr = fdp.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, _F.TYPE_STRING)
    _field(attr, "doc_string", 2, _F.TYPE_STRING)
    attr.oneof_decl.add(name="value")
    for kind, scalar_type, list_name in _ATTR_KINDS:
        _field(attr, f"{kind}_val", ATTR_FIELD_NUMBERS[f"{kind}_val"], scalar_type, oneof_index=0)
        _field(attr, f"{kind}_list", ATTR_FIELD_NUMBERS[f"{kind}_list"], _F.TYPE_MESSAGE,
               type_name=list_name, oneof_index=0)
    for kind, scalar_type, list_name in _ATTR_KINDS:
        lst = fdp.message_type.add(name=list_name)
        _field(lst, "values", 1, scalar_type, repeated=True)

    meta = fdp.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, _F.TYPE_STRING)
    _field(meta, "attr", 2, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    _enum(fdp, "NodeType", NodeType)
    _enum(fdp, "CollectiveCommType", CommType)

    node = fdp.message_type.add(name="Node")
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    _field(node, "type", 3, _F.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, repeated=True)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, repeated=True)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    io = fdp.message_type.add(name="IOInfo")
    _field(io, "values", 1, _F.TYPE_STRING)
    _field(io, "shapes", 2, _F.TYPE_STRING)
    _field(io, "types", 3, _F.TYPE_STRING)
    return fdp


# A private pool: the default pool may already hold another ChakraProtoMsg
# (e.g. the real chakra package) and a name clash there would be an error.
_POOL = descriptor_pool.DescriptorPool()
FILE_DESCRIPTOR = _POOL.Add(_build_file())


def _cls(name: str) -> type:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


AttributeProto = _cls("AttributeProto")
GlobalMetadata = _cls("GlobalMetadata")
Node = _cls("Node")
IOInfo = _cls("IOInfo")
BoolList = _cls("BoolList")
Int64List = _cls("Int64List")
Uint64List = _cls("Uint64List")
DoubleList = _cls("DoubleList")
StringList = _cls("StringList")

__all__ = [
    "ATTR_FIELD_NUMBERS",
    "AttributeProto",
    "BoolList",
    "CommType",
    "DoubleList",
    "GlobalMetadata",
    "IOInfo",
    "Int64List",
    "Node",
    "NodeType",
    "SCHEMA_VERSION",
    "StringList",
    "Uint64List",
]
