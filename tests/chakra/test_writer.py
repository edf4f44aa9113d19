"""Writing: round trips, byte-determinism, attribute oneofs, comm-group files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from stageopt.chakra import (
    CommType,
    NodeType,
    encode_trace,
    make_node,
    node_attrs,
    read_comm_groups,
    read_trace,
    write_comm_groups,
    write_trace,
)
from stageopt.chakra.et_schema import ATTR_FIELD_NUMBERS
from stageopt.errors import ConfigError

from .conftest import MICROBENCH_SETS
from .wire import node_summary, records


def sample_nodes() -> list:
    """A small stage program touching every attribute kind the generator writes."""
    return [
        make_node(0, "fwd.matmul", NodeType.COMP_NODE, num_ops=2 * 4096**3, tensor_size=3 * 2 * 4096**2,
                  is_cpu_op=False),
        make_node(1, "fwd.allreduce", NodeType.COMM_COLL_NODE, data_deps=[0], comm_type=CommType.ALL_REDUCE,
                  comm_size=2 * 4096**2, pg_name="3", is_cpu_op=False, involved_dim=[True, False]),
        make_node(2, "fwd.send", NodeType.COMM_SEND_NODE, data_deps=[1], comm_dst=5, comm_tag=7,
                  comm_size=1024, is_cpu_op=False),
        make_node(3, "bwd.recv", NodeType.COMM_RECV_NODE, ctrl_deps=[2], comm_src=5, comm_tag=8,
                  comm_size=1024, is_cpu_op=False),
        make_node(4, "opt.step", NodeType.COMP_NODE, data_deps=[3], ctrl_deps=[0], duration_micros=12,
                  num_ops=10, tensor_size=80, ratio=0.5, label="adam", shape=[1, 2, 3], names=["a", "b"]),
    ]


def test_round_trip(tmp_path: Path) -> None:
    nodes = sample_nodes()
    write_trace(tmp_path / "w.0.et", nodes)
    trace = read_trace(tmp_path / "w.0.et")
    assert trace.version == "0.0.4"
    assert trace.nodes == nodes
    assert node_attrs(trace.nodes[4]) == {"num_ops": 10, "tensor_size": 80, "ratio": 0.5, "label": "adam",
                                          "shape": [1, 2, 3], "names": ["a", "b"]}
    assert trace.nodes[4].duration_micros == 12
    assert list(trace.nodes[4].ctrl_deps) == [0] and list(trace.nodes[3].ctrl_deps) == [2]
    assert node_attrs(trace.nodes[1])["involved_dim"] == [True, False]


def test_byte_determinism(tmp_path: Path) -> None:
    write_trace(tmp_path / "a.et", sample_nodes())
    write_trace(tmp_path / "b.et", sample_nodes())
    digest = {hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in ("a.et", "b.et")}
    assert len(digest) == 1
    assert (tmp_path / "a.et").read_bytes() == encode_trace(sample_nodes())


def test_oneofs_mirror_reference_traces() -> None:
    """Each well-known attribute uses the oneof member seen in ASTRA-sim's and STAGE's traces."""
    expected = {"num_ops": "int64_val", "tensor_size": "uint64_val", "is_cpu_op": "bool_val",
                "comm_type": "int64_val", "comm_size": "int64_val", "pg_name": "string_val",
                "involved_dim": "bool_list", "comm_dst": "int32_val", "comm_src": "int32_val",
                "comm_tag": "int32_val", "ratio": "double_val", "label": "string_val",
                "shape": "int64_list", "names": "string_list"}
    seen = {}
    for node in sample_nodes():
        _, _, members = node_summary(node.SerializeToString())
        seen.update(members)
    assert seen == {k: ATTR_FIELD_NUMBERS[v] for k, v in expected.items()}


@pytest.mark.parametrize("name", MICROBENCH_SETS)
def test_rewriting_microbench_is_byte_identical(microbench_root: Path, name: str, tmp_path: Path) -> None:
    for path in sorted((microbench_root / name / "8npus_1MB").glob("*.et")):
        trace = read_trace(path)
        write_trace(tmp_path / path.name, trace.nodes, trace.version)
        assert (tmp_path / path.name).read_bytes() == path.read_bytes()
        # and make_node builds the same bytes from plain values
        n = trace.nodes[0]
        rebuilt = make_node(n.id, n.name, n.type, **node_attrs(n))
        assert records(path.read_bytes())[1] == rebuilt.SerializeToString(deterministic=True)


@pytest.mark.parametrize("attrs, message", [
    ({"pg_name": 3}, r"'pg_name' must be a string .*pass the string '3'"),
    ({"num_ops": 1.5e12}, r"'num_ops' must be an integer"),
    ({"comm_tag": 2**31}, r"'comm_tag'=2147483648 is outside the int32 range"),
    ({"tensor_size": -1}, r"'tensor_size'=-1 is outside the uint64 range"),
    ({"weird": {1: 2}}, r"attribute 'weird': unsupported value"),
])
def test_make_node_rejects_bad_attributes(attrs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_node(0, "n", NodeType.COMP_NODE, **attrs)


def test_make_node_rejects_unknown_type() -> None:
    with pytest.raises(ConfigError, match="unknown node type 42"):
        make_node(0, "n", 42)


def test_comm_groups_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "comm_groups.json"
    write_comm_groups(path, {2: [2, 3], 1: (0, 1)})
    assert path.read_text() == '{"1": [0, 1], "2": [2, 3]}\n'
    assert read_comm_groups(path) == {1: [0, 1], 2: [2, 3]}


@pytest.mark.parametrize("text, message", [
    ('{"0": [0, 1]}', r"group id '0' is invalid"),
    ('{"x": [0, 1]}', r"group id 'x' is not an integer"),
    ('{"1": []}', r"group '1' must be a non-empty list"),
    ('{"1": [0, -1]}', r"group '1' has rank -1"),
    ('{"1": [0, 0]}', r"lists rank\(s\) \[0\] more than once"),
    ('[[0, 1]]', r"expected a JSON object"),
    ('{"1": [0, 1]', r"not valid JSON"),
])
def test_read_comm_groups_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_comm_groups(path)


def test_write_comm_groups_refuses_singletons_and_bad_ids(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"group 4 has a single rank \[3\]"):
        write_comm_groups(tmp_path / "g.json", {4: [3]})
    write_comm_groups(tmp_path / "g.json", {4: [3]}, allow_singletons=True)
    assert json.loads((tmp_path / "g.json").read_text()) == {"4": [3]}
    with pytest.raises(ConfigError, match="group id 0 is invalid"):
        write_comm_groups(tmp_path / "g.json", {0: [0, 1]})
