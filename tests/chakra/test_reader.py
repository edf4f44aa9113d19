"""The reader against the reference traces, cross-checked by an independent wire parser."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from stageopt.chakra import CommType, NodeType, node_attrs, read_comm_groups, read_trace
from stageopt.chakra.et_schema import ATTR_FIELD_NUMBERS
from stageopt.errors import ConfigError

from .conftest import MICROBENCH_SETS, STAGE_SETS
from .wire import node_summary, records

# Node counts per type over all 8 ranks of each STAGE set. Written down from
# read_trace and confirmed by the hand parser in wire.py (the test checks both).
STAGE_COUNTS = {
    "dense_dp2_tp2_pp2": {"COMP_NODE": 9968, "COMM_COLL_NODE": 3536, "COMM_SEND_NODE": 8, "COMM_RECV_NODE": 8},
    "dense_dp2_tp2_pp2_mb4": {"COMP_NODE": 37904, "COMM_COLL_NODE": 14096, "COMM_SEND_NODE": 32, "COMM_RECV_NODE": 32},
    "llama_mp_dp2_tp2_pp2": {"COMP_NODE": 12848, "COMM_COLL_NODE": 3536, "COMM_SEND_NODE": 8, "COMM_RECV_NODE": 8},
}


def _et_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.et"))
    assert len(files) == 8, folder
    return files


@pytest.mark.parametrize("name", STAGE_SETS)
def test_stage_counts_match_independent_parser(stage_root: Path, name: str) -> None:
    ours: Counter = Counter()
    theirs: Counter = Counter()
    for path in _et_files(stage_root / name):
        trace = read_trace(path)
        ours.update(NodeType(n.type).name for n in trace.nodes)
        bodies = records(path.read_bytes())[1:]
        assert [n.id for n in trace.nodes] == [node_summary(b)[0] for b in bodies]
        theirs.update(NodeType(node_summary(b)[1]).name for b in bodies)
    assert ours == theirs == Counter(STAGE_COUNTS[name])


@pytest.mark.parametrize("name", MICROBENCH_SETS)
def test_microbench_each_rank_has_one_collective(microbench_root: Path, name: str) -> None:
    expected = {"all_gather": CommType.ALL_GATHER, "all_reduce": CommType.ALL_REDUCE,
                "all_to_all": CommType.ALL_TO_ALL, "reduce_scatter": CommType.REDUCE_SCATTER}[name]
    for path in _et_files(microbench_root / name / "8npus_1MB"):
        trace = read_trace(path)
        assert trace.version == "0.0.4"
        (node,) = trace.nodes
        assert node.type == NodeType.COMM_COLL_NODE
        attrs = node_attrs(node)
        assert attrs == {"is_cpu_op": False, "comm_type": int(expected), "comm_size": 1048576}
        # field numbers agree with the independent parser
        _, ntype, members = node_summary(records(path.read_bytes())[1])
        assert ntype == 7
        assert members == {"is_cpu_op": ATTR_FIELD_NUMBERS["bool_val"], "comm_type": ATTR_FIELD_NUMBERS["int64_val"],
                           "comm_size": ATTR_FIELD_NUMBERS["int64_val"]}


def test_node_attrs_decodes_every_kind(stage_root: Path) -> None:
    trace = read_trace(stage_root / "dense_dp2_tp2_pp2" / "workload.0.et")
    assert trace.version == ""  # STAGE leaves it empty and puts a "schema" attribute instead
    first = trace.nodes[0]
    assert (first.id, first.type, list(first.data_deps)) == (2, NodeType.COMP_NODE, [3442])
    attrs = node_attrs(first)
    assert attrs["num_ops"] == 671088640 and attrs["tensor_size"] == 134217728
    assert attrs["op_type"] == "E"
    assert attrs["inputs"] == ["mb0.in_emb.y@0MicroBatch/dp,Seq/(cp*tp),Dmodel", "134217728.0"]
    coll = next(n for n in trace.nodes if n.type == NodeType.COMM_COLL_NODE)
    cattrs = node_attrs(coll)
    assert cattrs["outputs"] is None  # an attribute with no value set
    assert cattrs["pg_name"] == "5" and cattrs["comm_type"] == CommType.ALL_GATHER
    send = next(n for n in trace.nodes if n.type == NodeType.COMM_SEND_NODE)
    assert {k: v for k, v in node_attrs(send).items() if k.startswith("comm")} == {
        "comm_size": 134217728, "comm_tag": 5103, "comm_dst": 4}


def test_stage_comm_groups(stage_root: Path) -> None:
    groups = read_comm_groups(stage_root / "dense_dp2_tp2_pp2" / "workload.json")
    assert groups[1] == [0, 1] and groups[5] == [0, 2] and groups[16] == [7]
    assert sorted(groups) == list(range(1, 17))


def test_truncated_file_names_file_and_offset(tmp_path: Path, microbench_root: Path) -> None:
    data = (microbench_root / "all_reduce" / "8npus_1MB" / "all_reduce.0.et").read_bytes()
    bad = tmp_path / "cut.0.et"
    bad.write_bytes(data[:-3])
    with pytest.raises(ConfigError, match=r"cut\.0\.et: message at byte \d+ declares \d+ bytes .* truncated"):
        read_trace(bad)
    (tmp_path / "empty.0.et").write_bytes(b"")
    with pytest.raises(ConfigError, match="empty file"):
        read_trace(tmp_path / "empty.0.et")
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "absent.0.et")
