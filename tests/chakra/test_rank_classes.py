"""Checking by symmetric class gives the same report as checking every file, on valid and broken sets.

The reference is ``validate_trace_dir(..., by_class=False)``: every file
decoded and checked node by node. Broken sets are made by editing one or two
rank files of a generated set the way a buggy generator would (a wrong group,
peer or tag, a changed size, a cycle), by hand and by Hypothesis.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stageopt.chakra import NodeType, read_trace, validate_trace_dir, write_trace
from stageopt.chakra._rank_classes import split_records
from stageopt.chakra.attrs import make_attr
from stageopt.cli import main

WORLD = 16


@pytest.fixture(scope="module")
def clean_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama3-8b cut to 2 layers on dp=4 tp=2 pp=2: 4 classes of 4 ranks by stage and TP position."""
    out = tmp_path_factory.mktemp("classes") / "set"
    code = main(["generate", "--model", "llama3-8b", "--set", "layers=2", "--set", "seq=256",
                 "--plan", "dp=4 tp=2 pp=2 gbs=8", "--gpus", str(WORLD), "--hardware", "h100-sxm",
                 "--out", str(out), "--progress", "off"])
    assert code == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(directory: Path, rank: int, name: str, pick: int, value: object, node_type: int | None = None) -> bool:
    """Set attribute ``name`` of the ``pick``-th node carrying it in rank's file; False if there is none."""
    path = directory / f"workload.{rank}.et"
    trace = read_trace(path)
    carriers = [n for n in trace.nodes if any(a.name == name for a in n.attr)
                and (node_type is None or n.type == node_type)]
    if not carriers:
        return False
    node = carriers[pick % len(carriers)]
    for i, attr in enumerate(node.attr):
        if attr.name == name:
            node.attr[i].CopyFrom(make_attr(name, value, attr.WhichOneof("value")))
    write_trace(path, trace.nodes, trace.version)
    return True


def _same_report(directory: Path) -> tuple:
    fast = validate_trace_dir(directory, max_per_kind=50)
    slow = validate_trace_dir(directory, max_per_kind=50, by_class=False)
    assert slow.n_full_checks == slow.n_files
    for field in ("ok", "violations", "warnings", "n_violations", "n_warnings", "n_nodes", "node_counts",
                  "finding_counts"):
        assert getattr(fast, field) == getattr(slow, field), field
    return fast, slow


def test_clean_set_checks_one_file_per_class(clean_set: Path) -> None:
    fast, _ = _same_report(clean_set)
    assert fast.ok and fast.n_files == WORLD
    keys = {split_records((clean_set / f"workload.{r}.et").read_bytes())[0] for r in range(WORLD)}
    assert fast.n_full_checks == len(keys) < WORLD


def test_class_key_ignores_only_rank_specific_records(clean_set: Path) -> None:
    data = (clean_set / "workload.0.et").read_bytes()
    key, records = split_records(data)
    trace = read_trace(clean_set / "workload.0.et")
    held = [a.SerializeToString() for n in trace.nodes for a in n.attr
            if a.name in ("pg_name", "comm_src", "comm_dst", "comm_tag")]
    assert sorted(records) == sorted(held) and records
    assert len(key) < len(data)


SEND, RECV, COLL = int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE), int(NodeType.COMM_COLL_NODE)


@pytest.mark.parametrize("rank, name, pick, value, node_type, rule", [
    (5, "pg_name", 0, "1", COLL, "pg-name"),           # a group rank 5 is not in
    (6, "pg_name", 3, "999", COLL, "pg-name"),         # no such group
    (9, "comm_dst", 0, 9, SEND, "p2p-attrs"),          # a send to itself
    (1, "comm_dst", 0, 40, SEND, "p2p-attrs"),         # a rank beyond the set
    (10, "comm_src", 1, 3, RECV, "p2p-unmatched"),     # a receive from a rank that sends nothing there
    (2, "comm_tag", 1, 12345, SEND, "p2p-unmatched"),  # a tag nobody receives
    (3, "comm_size", 2, 7, COLL, "group-sequence"),    # not rank-specific: a class of its own
])
def test_broken_member_same_findings(clean_set: Path, tmp_path: Path, rank, name, pick, value, node_type,
                                     rule) -> None:
    broken = _copy(clean_set, tmp_path / "set")
    assert _edit(broken, rank, name, pick, value, node_type)
    fast, _ = _same_report(broken)
    assert not fast.ok and f"error:{rule}" in fast.finding_counts


def test_member_with_undecodable_group_name(clean_set: Path, tmp_path: Path) -> None:
    """A pg_name that is not UTF-8 (protobuf refuses it) is a decode error, as in a file-by-file check."""
    broken = _copy(clean_set, tmp_path / "set")
    path = broken / "workload.5.et"
    data = path.read_bytes()
    head = b"\x0a\x07pg_name\xea\x01\x01"
    at = data.index(head) + len(head)
    path.write_bytes(data[:at] + b"\xff" + data[at + 1:])
    fast, _ = _same_report(broken)
    assert fast.finding_counts.get("error:decode") == 1


def test_broken_representative_findings_copied_to_members(clean_set: Path, tmp_path: Path) -> None:
    """A cycle in every rank of a class is found in every one of them, though only one is decoded."""
    broken = _copy(clean_set, tmp_path / "set")
    for rank in range(WORLD):
        path = broken / f"workload.{rank}.et"
        trace = read_trace(path)
        trace.nodes[0].ctrl_deps.append(trace.nodes[-1].id)
        write_trace(path, trace.nodes, trace.version)
    fast, _ = _same_report(broken)
    assert fast.finding_counts["error:cycle"] == WORLD and fast.n_full_checks < WORLD


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, WORLD - 1),
                                 st.sampled_from(["pg_name", "comm_src", "comm_dst", "comm_tag"]),
                                 st.integers(0, 50), st.integers(-2, 40)), min_size=1, max_size=3))
def test_random_rank_specific_edits_same_report(clean_set: Path, tmp_path_factory, edits) -> None:
    broken = _copy(clean_set, tmp_path_factory.mktemp("fuzz") / "set")
    for rank, name, pick, value in edits:
        _edit(broken, rank, name, pick, str(value) if name == "pg_name" else value)
    _same_report(broken)
