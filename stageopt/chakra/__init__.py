"""Chakra execution traces (schema v0.0.4): schema, reader, writer, validator.

Owns the trace format: the protobuf schema built from Python descriptors,
byte-deterministic reading and writing, per-rank templates and the strict
set validator. The public surface other packages code against is re-exported
here; implementations live in the submodules. Imports only ``errors``.
"""

from stageopt.chakra.attrs import AttrValue, make_attr, node_attrs
from stageopt.chakra.comm_groups import read_comm_groups, write_comm_groups
from stageopt.chakra.et_schema import SCHEMA_VERSION, AttributeProto, CommType, GlobalMetadata, Node, NodeType
from stageopt.chakra.io import Trace, encode_trace, make_node, read_trace, write_trace
from stageopt.chakra.template import RANK_SPECIFIC_ATTRS, TraceTemplate
from stageopt.chakra.validate import ValidationReport, validate_trace_dir

__all__ = [
    "RANK_SPECIFIC_ATTRS",
    "SCHEMA_VERSION",
    "AttrValue",
    "AttributeProto",
    "CommType",
    "GlobalMetadata",
    "Node",
    "NodeType",
    "Trace",
    "TraceTemplate",
    "ValidationReport",
    "encode_trace",
    "make_attr",
    "make_node",
    "node_attrs",
    "read_comm_groups",
    "read_trace",
    "validate_trace_dir",
    "write_comm_groups",
    "write_trace",
]
