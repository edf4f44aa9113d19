"""The validator passes the reference sets and names the rule, file and node on broken ones."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from stageopt.chakra import (
    CommType,
    NodeType,
    TraceTemplate,
    make_node,
    validate_trace_dir,
    write_comm_groups,
    write_trace,
)
from stageopt.commands import validate_trace_command as validate_trace
from stageopt.errors import ConfigError

from .conftest import MICROBENCH_SETS, STAGE_SETS

GROUPS = {1: [0, 1], 2: [2, 3], 3: [0, 2], 4: [1, 3]}  # tp pairs and dp pairs over 4 ranks


def rank_nodes(rank: int) -> list:
    """A valid 4-rank program: TP all-reduce, a send/recv between stages, DP all-gather."""
    first_stage = rank < 2
    p2p = (make_node(2, "send", NodeType.COMM_SEND_NODE, data_deps=[1], comm_dst=rank + 2, comm_tag=10 + rank,
                     comm_size=64) if first_stage else
           make_node(2, "recv", NodeType.COMM_RECV_NODE, data_deps=[1], comm_src=rank - 2, comm_tag=rank + 8,
                     comm_size=64))
    return [
        make_node(0, "mm", NodeType.COMP_NODE, num_ops=1000, tensor_size=100),
        make_node(1, "tp_ar", NodeType.COMM_COLL_NODE, data_deps=[0], comm_type=CommType.ALL_REDUCE,
                  comm_size=100, pg_name="1" if first_stage else "2"),
        p2p,
        make_node(3, "dp_ag", NodeType.COMM_COLL_NODE, data_deps=[2], comm_type=CommType.ALL_GATHER,
                  comm_size=50, pg_name="3" if rank % 2 == 0 else "4"),
    ]


def write_set(folder: Path, mutate: Callable[[int, list], list] | None = None, groups: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(4):
        nodes = rank_nodes(rank)
        write_trace(folder / f"workload.{rank}.et", mutate(rank, nodes) if mutate else nodes)
    write_comm_groups(folder / "comm_groups.json", groups or GROUPS, allow_singletons=True)
    return folder


def test_valid_set_passes(tmp_path: Path) -> None:
    report = validate_trace_dir(write_set(tmp_path))
    assert report.ok, report.violations
    assert report.violations == [] and report.warnings == []
    assert report.node_counts == {"COMM_COLL_NODE": 8, "COMM_RECV_NODE": 2, "COMM_SEND_NODE": 2, "COMP_NODE": 4}
    assert (report.n_files, report.n_nodes) == (4, 16)


def test_template_rendered_set_passes_with_workers(tmp_path: Path) -> None:
    """Ranks written by symmetry from one template per stage; checked in two processes."""
    for stage in (0, 1):
        template = TraceTemplate(rank_nodes(2 * stage))
        for rank in (2 * stage, 2 * stage + 1):
            template.write(tmp_path / f"workload.{rank}.et", {
                "pg_name": {"1": "1", "2": "2", "3": "3" if rank % 2 == 0 else "4"},
                "comm_dst": {2: rank + 2}, "comm_src": {0: rank - 2},
                "comm_tag": {10: 10 + rank % 2},
            })
    write_comm_groups(tmp_path / "comm_groups.json", GROUPS)
    report = validate_trace_dir(tmp_path, workers=2)
    assert report.ok, report.violations


def _replace(target: int, index: int, node: object) -> Callable[[int, list], list]:
    """Mutation that puts `node` at position `index` of rank `target`."""
    def mutate(r: int, nodes: list) -> list:
        if r == target:
            nodes[index] = node
        return nodes
    return mutate


BROKEN = {
    "missing-dep": (
        _replace(1, 3, make_node(3, "dp_ag", NodeType.COMM_COLL_NODE, data_deps=[99], comm_type=CommType.ALL_GATHER,
                                 comm_size=50, pg_name="4")),
        r"\[missing-dep\] workload\.1\.et: node 3 \('dp_ag'\): depends on id 99, which is not in the file"),
    "cycle": (
        _replace(0, 0, make_node(0, "mm", NodeType.COMP_NODE, ctrl_deps=[3], num_ops=1000, tensor_size=100)),
        r"\[cycle\] workload\.0\.et: dependency cycle 0 -> 3 -> 2 -> 1 -> 0"),
    "group-sequence": (
        _replace(3, 1, make_node(1, "tp_ar", NodeType.COMM_COLL_NODE, data_deps=[0], comm_type=CommType.ALL_REDUCE,
                                 comm_size=200, pg_name="2")),
        r"\[group-sequence\] group 2 \[2, 3\]: collective #0 is ALL_REDUCE of 200 B \(node 1\) on rank 3 "
        r"but ALL_REDUCE of 100 B \(node 1\) on rank 2"),
    "p2p-unmatched": (
        _replace(3, 2, make_node(2, "mm2", NodeType.COMP_NODE, data_deps=[1], num_ops=1, tensor_size=1)),
        r"\[p2p-unmatched\] workload\.1\.et: node 2 sends 64 B to rank 3 tag 11, but rank 3 has no COMM_RECV "
        r"from rank 1 with that tag"),
    "singleton-group": (
        _replace(1, 3, make_node(3, "dp_ag", NodeType.COMM_COLL_NODE, data_deps=[2], comm_type=CommType.ALL_GATHER,
                                 comm_size=50, pg_name="5")),
        r"\[singleton-group\] group 5 \[1\] has one rank and is used by 1 collective\(s\), first workload\.1\.et: "
        r"node 3"),
    "pg-name": (
        _replace(0, 1, make_node(1, "tp_ar", NodeType.COMM_COLL_NODE, data_deps=[0], comm_type=CommType.ALL_REDUCE,
                                 comm_size=100, pg_name="9")),
        r"\[pg-name\] workload\.0\.et: node 1 \('tp_ar'\): pg_name '9' names no group in comm_groups\.json"),
    "node-type": (
        _replace(2, 0, make_node(0, "meta", NodeType.METADATA_NODE)),
        r"\[node-type\] workload\.2\.et: node 0 \('meta'\): METADATA_NODE in the node stream"),
    "comp-attrs": (
        _replace(2, 0, make_node(0, "mm", NodeType.COMP_NODE, num_ops=1000)),
        r"\[comp-attrs\] workload\.2\.et: node 0 \('mm'\): missing attribute\(s\) tensor_size"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_set_is_reported_precisely(tmp_path: Path, kind: str) -> None:
    mutate, message = BROKEN[kind]
    groups = {**GROUPS, 5: [1]} if kind == "singleton-group" else GROUPS
    report = validate_trace_dir(write_set(tmp_path, mutate, groups))
    assert not report.ok
    assert report.finding_counts.get(f"error:{kind}", 0) >= 1, report.violations
    assert any(re.search(message, v) for v in report.violations), report.violations


def test_float_num_ops_is_an_error(tmp_path: Path) -> None:
    folder = write_set(tmp_path)
    nodes = rank_nodes(0)
    comp = nodes[0]
    comp.attr[0].ClearField("int64_val")
    comp.attr[0].double_val = 1000.0
    write_trace(folder / "workload.0.et", nodes)
    report = validate_trace_dir(folder)
    assert "[comp-attrs] workload.0.et: node 0 ('mm'): num_ops is double_val, not an integer" in report.violations


def test_unused_singleton_is_a_warning_and_strict_order(tmp_path: Path) -> None:
    def shift(rank: int, nodes: list) -> list:  # ids 10.. and a dependency on a later node
        renum = [make_node(n.id + 10, n.name, n.type, data_deps=[d + 10 for d in n.data_deps]) for n in nodes]
        for old, new in zip(nodes, renum):
            new.attr.extend(old.attr)
        return renum
    folder = write_set(tmp_path, shift, {**GROUPS, 7: [2]})
    report = validate_trace_dir(folder)
    assert report.ok
    assert "[singleton-group] group 7 [2] has one rank (unused)" in report.warnings
    assert report.finding_counts["warning:order-ids"] == 4
    strict = validate_trace_dir(folder, strict_order=True)
    assert not strict.ok and strict.finding_counts["error:order-ids"] == 4


def test_missing_rank_file_and_bad_group_ranks(tmp_path: Path) -> None:
    folder = write_set(tmp_path, groups={**GROUPS, 6: [2, 9]})
    (folder / "workload.1.et").unlink()
    report = validate_trace_dir(folder)
    assert any(v.startswith("[files] ranks [1] have no workload.<rank>.et file") for v in report.violations)
    assert any("group 6 has rank(s) [9]" in v for v in report.violations)


@pytest.mark.parametrize("name", STAGE_SETS)
def test_stage_reference_sets_pass(stage_root: Path, name: str) -> None:
    report = validate_trace_dir(stage_root / name)
    assert report.ok, report.violations
    # What STAGE's traces do that ours must not: findings are warnings only.
    assert report.finding_counts == {"warning:order-deps": 8, "warning:order-ids": 8,
                                     "warning:singleton-group": 8, "warning:version": 8}
    assert report.comm_group_file.endswith("workload.json")


@pytest.mark.parametrize("name", MICROBENCH_SETS)
def test_microbench_sets_pass(microbench_root: Path, name: str) -> None:
    report = validate_trace_dir(microbench_root / name / "8npus_1MB", prefix=name)
    assert report.ok, report.violations
    assert report.node_counts == {"COMM_COLL_NODE": 8}


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    validate_trace.add_parser(parser.add_subparsers())
    return parser.parse_args(["validate-trace", *argv])


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = write_set(tmp_path / "good")
    assert validate_trace.run(_cli([str(good)])) == 0
    assert "OK" in capsys.readouterr().out
    bad = write_set(tmp_path / "bad", *BROKEN["missing-dep"][:1])
    assert validate_trace.run(_cli([str(bad), "--max-per-kind", "1"])) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "depends on id 99" in out
    with pytest.raises(ConfigError, match="does not exist") as err:
        validate_trace.run(_cli([str(tmp_path / "nope")]))
    assert err.value.exit_code == 2
    with pytest.raises(ConfigError, match=r"no trace files named other\.<rank>\.et; found prefix\(es\) \['workload'\]"):
        validate_trace.run(_cli([str(good), "--prefix", "other"]))
