"""Chakra execution traces (schema v0.0.4): schema, reader, writer, validator.

The public surface other packages code against; implementations live in the
submodules (``schema``, ``attrs``, ``io``, ``comm_groups``, ``template``,
``validate``).
"""

from stageopt.chakra.attrs import AttrValue, make_attr, node_attrs
from stageopt.chakra.comm_groups import read_comm_groups, write_comm_groups
from stageopt.chakra.io import Trace, encode_trace, make_node, read_trace, write_trace
from stageopt.chakra.schema import SCHEMA_VERSION, AttributeProto, CommType, GlobalMetadata, Node, NodeType

__all__ = [
    "SCHEMA_VERSION",
    "AttrValue",
    "AttributeProto",
    "CommType",
    "GlobalMetadata",
    "Node",
    "NodeType",
    "Trace",
    "encode_trace",
    "make_attr",
    "make_node",
    "node_attrs",
    "read_comm_groups",
    "read_trace",
    "write_comm_groups",
    "write_trace",
]
