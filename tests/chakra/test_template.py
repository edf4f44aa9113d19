"""TraceTemplate must produce exactly what write_trace produces for the patched nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.chakra import (
    CommType,
    NodeType,
    TraceTemplate,
    encode_trace,
    make_node,
    node_attrs,
    read_trace,
    write_trace,
)
from stageopt.errors import ConfigError


def stage_program() -> list:
    """One stage with placeholder communicators ("tp", "dp") and peers (-1 = next stage)."""
    nodes = []
    for i in range(0, 60, 6):
        nodes += [
            make_node(i, f"l{i}.qkv", NodeType.COMP_NODE, data_deps=[i - 1] if i else [], num_ops=10**9 + i,
                      tensor_size=4096, is_cpu_op=False),
            make_node(i + 1, f"l{i}.ag", NodeType.COMM_COLL_NODE, data_deps=[i], comm_type=CommType.ALL_GATHER,
                      comm_size=2048, pg_name="tp", is_cpu_op=False),
            make_node(i + 2, f"l{i}.rs", NodeType.COMM_COLL_NODE, data_deps=[i + 1], comm_type=CommType.REDUCE_SCATTER,
                      comm_size=4096, pg_name="tp", is_cpu_op=False),
            make_node(i + 3, f"l{i}.grad", NodeType.COMM_COLL_NODE, data_deps=[i + 2], comm_type=CommType.ALL_REDUCE,
                      comm_size=8192, pg_name="dp", is_cpu_op=False),
            make_node(i + 4, f"l{i}.send", NodeType.COMM_SEND_NODE, data_deps=[i + 3], comm_dst=-1, comm_tag=i,
                      comm_size=512, is_cpu_op=False),
            make_node(i + 5, f"l{i}.all", NodeType.COMM_COLL_NODE, data_deps=[i + 4], comm_type=CommType.ALL_REDUCE,
                      comm_size=8, pg_name="", is_cpu_op=False),
        ]
    return nodes


def patched_copy(nodes: list, patches: dict) -> list:
    """The slow reference: substitute attribute values node by node."""
    out = []
    for node in nodes:
        new = type(node)()
        new.CopyFrom(node)
        for attr in new.attr:
            member = attr.WhichOneof("value")
            mapping = patches.get(attr.name, {})
            if member and getattr(attr, member) in mapping:
                setattr(attr, member, mapping[getattr(attr, member)])
        out.append(new)
    return out


@pytest.mark.parametrize("rank", [0, 1, 7, 1000, 32767])
def test_render_equals_write_trace(tmp_path: Path, rank: int) -> None:
    nodes = stage_program()
    template = TraceTemplate(nodes)
    patches = {
        "pg_name": {"tp": str(rank // 8 + 1), "dp": str(100000 + rank % 8)},
        "comm_dst": {-1: rank + 8},
        "comm_tag": {i: 50000 + rank * 64 + i for i in range(0, 60, 6)},
    }
    write_trace(tmp_path / "slow.et", patched_copy(nodes, patches))
    template.write(tmp_path / "fast.et", patches)
    assert (tmp_path / "fast.et").read_bytes() == (tmp_path / "slow.et").read_bytes()
    trace = read_trace(tmp_path / "fast.et")
    assert node_attrs(trace.nodes[1])["pg_name"] == str(rank // 8 + 1)
    assert node_attrs(trace.nodes[4])["comm_dst"] == rank + 8


def test_empty_patch_is_the_template_and_placeholders_are_listed() -> None:
    nodes = stage_program()
    template = TraceTemplate(nodes)
    assert template.render({}) == encode_trace(nodes)
    assert template.placeholders == {"pg_name": ["tp", "dp", ""], "comm_dst": [-1],
                                     "comm_tag": list(range(0, 60, 6))}


def test_template_without_rank_specific_nodes() -> None:
    nodes = [make_node(0, "a", NodeType.COMP_NODE, num_ops=1, tensor_size=1)]
    assert TraceTemplate(nodes, version="x").render({"pg_name": {"tp": "1"}}) == encode_trace(nodes, "x")


def test_render_rejects_bad_patches() -> None:
    template = TraceTemplate(stage_program())
    with pytest.raises(ConfigError, match=r"patches name attribute\(s\) \['num_ops'\]"):
        template.render({"num_ops": {1: 2}})
    with pytest.raises(ConfigError, match="'pg_name' must be a string"):
        template.render({"pg_name": {"tp": 5}})
    with pytest.raises(ConfigError, match="'comm_dst' must be an integer"):
        template.render({"comm_dst": {-1: "5"}})
