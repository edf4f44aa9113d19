"""Deliberately broken copies of a generated set fail validation with a message that names
the file, the node and the rule (and a corrupted file fails the replay the same way)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from stageopt.chakra import NodeType, make_attr, node_attrs, read_trace, validate_trace_dir, write_trace

from .matrix import LLAMA

CASE = (LLAMA, "tp=2 pp=2 gbs=2", 4, "layer")  # ranks 0,1 = stage 0; 2,3 = stage 1


@pytest.fixture()
def good(generated, tmp_path: Path) -> Path:
    _work, out = generated(CASE)
    dest = tmp_path / "set"
    shutil.copytree(out, dest)
    return dest


def edit(folder: Path, rank: int, change: Callable[[list], None]) -> None:
    path = folder / f"workload.{rank}.et"
    nodes = read_trace(path).nodes
    change(nodes)
    write_trace(path, nodes)


def first(nodes: list, ntype: NodeType, **attrs: object):
    for n in nodes:
        a = node_attrs(n)
        if n.type == ntype and all(a.get(k) == v for k, v in attrs.items()):
            return n
    raise AssertionError(f"no {ntype.name} with {attrs}")


def set_attr(node, name: str, value: object, oneof: str | None = None) -> None:
    for i, a in enumerate(node.attr):
        if a.name == name:
            node.attr[i].CopyFrom(make_attr(name, value, oneof))
            return
    raise AssertionError(name)


def findings(folder: Path) -> str:
    rep = validate_trace_dir(folder, strict_order=True)
    assert not rep.ok
    return "\n".join(rep.violations)


def test_the_untouched_copy_is_valid(good: Path) -> None:
    assert validate_trace_dir(good, strict_order=True).ok


def test_a_send_with_a_wrong_tag_is_unmatched(good: Path) -> None:
    edit(good, 0, lambda nodes: set_attr(first(nodes, NodeType.COMM_SEND_NODE), "comm_tag", 4242))
    msg = findings(good)
    assert "[p2p-unmatched] workload.0.et: node" in msg and "to rank 2 tag 4242" in msg
    assert "workload.2.et: node" in msg and "receives" in msg  # the receive left waiting


def test_a_resized_collective_breaks_its_group_sequence(good: Path) -> None:
    def change(nodes: list) -> None:
        node = first(nodes, NodeType.COMM_COLL_NODE)
        set_attr(node, "comm_size", node_attrs(node)["comm_size"] + 2)
    edit(good, 1, change)
    msg = findings(good)
    assert "[group-sequence] group" in msg and "[0, 1]" in msg and "collective #0" in msg and "rank 1" in msg


def test_an_unknown_group_id_is_named(good: Path) -> None:
    edit(good, 3, lambda nodes: set_attr(first(nodes, NodeType.COMM_COLL_NODE), "pg_name", "99"))
    assert "[pg-name] workload.3.et: node" in findings(good) and "pg_name '99' names no group" in findings(good)


def test_a_dependency_cycle_is_shown(good: Path) -> None:
    def change(nodes: list) -> None:
        nodes[0].ctrl_deps.append(nodes[5].id)
    edit(good, 2, change)
    msg = findings(good)
    assert "[cycle] workload.2.et: dependency cycle 0 ->" in msg
    assert "[order-deps] workload.2.et" in msg  # strict mode: a dependency on a later node


def test_a_metadata_node_in_the_stream_is_fatal(good: Path) -> None:
    edit(good, 1, lambda nodes: setattr(nodes[3], "type", int(NodeType.METADATA_NODE)))
    assert "[node-type] workload.1.et: node 3" in findings(good)


def test_a_float_num_ops_is_rejected(good: Path) -> None:
    node_id = first(read_trace(good / "workload.0.et").nodes, NodeType.COMP_NODE).id
    edit(good, 0, lambda nodes: set_attr(first(nodes, NodeType.COMP_NODE), "num_ops", 1.5, "double_val"))
    msg = findings(good)
    assert f"[comp-attrs] workload.0.et: node {node_id} (" in msg and "num_ops is double_val, not an integer" in msg


def test_a_missing_rank_file_is_named(good: Path) -> None:
    (good / "workload.2.et").unlink()
    msg = findings(good)
    assert "[files] ranks [2] have no workload.<rank>.et file" in msg
