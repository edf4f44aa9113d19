"""``stageopt generate`` end to end: the files it writes, subsets, reproducibility, bad inputs."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from stageopt.chakra import read_comm_groups
from stageopt.cli import main

MODEL = ["--model", "llama3-8b", "--set", "layers=4", "--set", "seq=256"]
PLAN = ["--plan", "tp=2 pp=2 dp=2 gbs=4 sp=on zero=1", "--gpus", "8", "--hardware", "h100-sxm"]
EXPECTED = {f"workload.{r}.et" for r in range(8)} | {"comm_groups.json", "system.json", "network.yml",
                                                     "memory.json", "run_astrasim.sh"}


def run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    rc = main(args)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_writes_every_file_and_prints_the_command(tmp_path: Path, capsys) -> None:
    rc, out, _ = run(["generate", *MODEL, *PLAN, "--out", str(tmp_path)], capsys)
    assert rc == 0
    assert {p.name for p in tmp_path.iterdir()} == EXPECTED
    assert "wrote 8 traces" in out and "--workload-configuration=" in out and "$STAGEOPT_ASTRA_SIM" in out
    script = (tmp_path / "run_astrasim.sh").read_text()
    assert "STAGEOPT_ASTRA_SIM" in script and "--comm-group-configuration=./comm_groups.json" in script
    groups = read_comm_groups(tmp_path / "comm_groups.json")
    # tp pairs (4) and dp pairs (4); no singleton, no pp group (pipelines talk point to point)
    assert sorted(map(tuple, groups.values())) == [(0, 1), (0, 2), (1, 3), (2, 3), (4, 5), (4, 6), (5, 7), (6, 7)]
    network = (tmp_path / "network.yml").read_text()
    assert "npus_count: [ 8 ]" in network
    assert json.loads((tmp_path / "system.json").read_text())["roofline-enabled"] == 0  # kernel times in the traces


def test_same_inputs_give_byte_identical_files(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert run(["generate", *MODEL, *PLAN, "--out", str(d)], capsys)[0] == 0
    match, mismatch, errors = filecmp.cmpfiles(a, b, sorted(EXPECTED), shallow=False)
    assert not mismatch and not errors and len(match) == len(EXPECTED)


def test_rank_subset_writes_only_those_ranks_identically(tmp_path: Path, capsys) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    assert run(["generate", *MODEL, *PLAN, "--out", str(full)], capsys)[0] == 0
    rc, out, _ = run(["generate", *MODEL, *PLAN, "--out", str(part), "--ranks", "1-2,6"], capsys)
    assert rc == 0 and "subset of 8" in out
    traces = {p.name for p in part.glob("*.et")}
    assert traces == {"workload.1.et", "workload.2.et", "workload.6.et"}
    for name in traces | {"comm_groups.json", "network.yml"}:
        assert (part / name).read_bytes() == (full / name).read_bytes(), name


@pytest.mark.parametrize("args, needle", [
    (["--hardware", "h100-sxn"], "unknown hardware preset 'h100-sxn'"),
    (["--ranks", "0-8"], "--ranks 0-8: ranks are 0..7 for 8 GPUs"),
    (["--ranks", "3-1"], "runs backwards"),
    (["--ranks", "a"], "--ranks item 'a' is not N or N-M"),
    (["--plan", "tp=3 dp=1", "--gpus", "3"], "tp=3 does not divide heads=32"),
    (["--plan", "tp=2 pp=2 dp=4"], "but gpus=8"),
    (["--plan", "tp=2 pipeline=2"], "unknown key 'pipeline'"),
    (["--hw-set", "node.bandwith_gbps=900"], "is not a hardware field"),
    (["--gpus", "12", "--plan", "tp=2 pp=2"], "not a multiple of node.gpus=8"),
    (["--dp-bucket", "tensor"], "invalid choice: 'tensor'"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path, capsys) -> None:
    base = {"--plan": "tp=2 pp=2 dp=2 gbs=4", "--gpus": "8", "--hardware": "h100-sxm", "--out": str(tmp_path / "o")}
    for key, value in zip(args[::2], args[1::2]):
        base[key] = value
    argv = ["generate", *MODEL] + [x for kv in base.items() for x in kv]
    try:
        rc = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "o").exists()  # nothing is written for a bad request


def test_unwritable_output_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out, needle in ((blocker, "exists and is not a directory"), (blocker / "sub", "cannot create it")):
        rc, _, err = run(["generate", *MODEL, *PLAN, "--out", str(out)], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err

