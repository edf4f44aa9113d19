"""The journal under faults: cut, corrupted, unwritable, full disk. Recovered up to its last good record with a
one-line warning naming what was dropped; write errors are one line and exit 2; a full disk stops the search
cleanly and a later --resume continues with every finished trial kept."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import optuna
import pytest
from conftest import SMALL, run_cli, search_json

from stageopt.search import journal as journal_module
from stageopt.search.journal import JournalError
from stageopt.search.session import SearchOptions, run_search
from stageopt.search.storage import open_storage

BAD_RECORDS = {
    "bad JSON": b'{"op_code": 8, "worker_id": "x", "trial_id": 0, "user_attr": {"a": \n',
    "binary bytes": b"\xff\xfe\x00\x81garbage\x00\n",
    "unknown op code": b'{"op_code": 99, "worker_id": "x"}\n',
    "malformed record": b'{"op_code": 4, "worker_id": "x"}\n',  # CREATE_TRIAL without its study
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("faults") / "runs"
    search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "12", "--seed", "1", "--runs-dir", str(runs),
                "--study-name", "f")
    return runs / "f" / "journal.log"


def _complete_numbers(storage, name: str = "f") -> set[int]:
    study = optuna.load_study(study_name=name, storage=storage)
    return {t.number for t in study.trials if t.state.is_finished()}


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
@pytest.mark.parametrize("where", ["middle", "end"])
def test_damaged_journal_is_recovered_up_to_its_last_good_record(finished: Path, tmp_path: Path, capsys,
                                                                 kind: str, where: str) -> None:
    lines = finished.read_bytes().splitlines(keepends=True)
    cut = len(lines) // 2 if where == "middle" else len(lines)
    path = tmp_path / "f" / "journal.log"
    path.parent.mkdir()
    path.write_bytes(b"".join(lines[:cut]) + BAD_RECORDS[kind] + b"".join(lines[cut:]))
    damaged = path.read_bytes()
    prefix = tmp_path / "prefix" / "journal.log"
    prefix.parent.mkdir()
    prefix.write_bytes(b"".join(lines[:cut]))
    expected = _complete_numbers(open_storage(None, prefix.parent, write=False).storage)

    view = open_storage(None, path.parent, write=False)  # report: reads the good prefix, leaves the file alone
    assert path.read_bytes() == damaged and _complete_numbers(view.storage) == expected
    store = open_storage(None, path.parent)  # search: repairs
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
    dropped = len(lines) - cut + 1
    assert f"record {cut + 1} is" in warning and f"dropped {dropped:,}" in warning
    assert path.read_bytes() == b"".join(lines[:cut]) and _complete_numbers(store.storage) == expected
    aside = next(path.parent.glob("journal.log.dropped-*"))
    assert aside.read_bytes() == BAD_RECORDS[kind] + b"".join(lines[cut:])  # nothing destroyed, only moved


def test_cut_last_line_then_resume_and_report_through_the_cli(finished: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(finished.parent, runs / "f")
    journal = runs / "f" / "journal.log"
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code":8,"worker_id":"x","trial_id":3,"user_a')  # a write cut by a crash
    report = run_cli("report", str(runs / "f"), "--no-plots")
    assert report.returncode == 0, report.stderr
    assert report.stderr.strip() == (f"stageopt: warning: {journal}: the last record was cut mid-line (crash or "
                                     "full disk); skipped it (1 record)")
    out = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "16", "--runs-dir", str(runs), "--study-name", "f",
                      "--resume")
    assert out["simulations"] == 16 and journal.read_bytes().startswith(whole)


def _inject_enospc_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    real_write, count = os.write, [0]

    def write(fd: int, data) -> int:
        count[0] += 1
        if count[0] > writes:
            half = bytes(data)[: max(1, len(data) // 2)]
            real_write(fd, half)  # the disk takes part of the record, then is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(journal_module.os, "write", write)


def test_full_disk_stops_the_search_cleanly_and_resume_continues(tmp_path: Path, monkeypatch) -> None:
    opts = SearchOptions(space=str(SMALL), budget=30, seed=1, runs_dir=str(tmp_path), study_name="full")
    _inject_enospc_after(monkeypatch, 400)
    with pytest.raises(JournalError, match="No space left on device.*free space"):
        run_search(opts)
    monkeypatch.undo()
    journal = tmp_path / "full" / "journal.log"
    assert journal.read_bytes().endswith(b"\n")  # the half-written record was cut back
    before = _complete_numbers(open_storage(None, journal.parent, write=False).storage, "full")
    assert before
    result = run_search(SearchOptions(space=str(SMALL), budget=30, seed=1, runs_dir=str(tmp_path),
                                      study_name="full", resume=True))
    assert len(result.loop.cache.simulated) == 30
    study = result.study
    assert before <= {t.number for t in study.trials if t.state.is_finished()}


def _can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    where.mkdir(parents=True, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                        capture_output=True).returncode == 0
    return ok


def test_a_real_full_disk_through_the_cli(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if not _can_mount_tmpfs(disk):
        pytest.skip("needs root to mount a 64 KiB tmpfs (the ENOSPC injection test covers the logic)")
    try:
        proc = run_cli("search", "--space", str(SMALL), "--sampler", "tpe", "--budget", "40", "--seed", "2", "--runs-dir", str(disk),
                       "--study-name", "d", "--no-plots")
        assert proc.returncode == 2, proc.stderr
        err = proc.stderr.strip()
        assert len(err.splitlines()) == 1 and "No space left on device" in err and "--resume" in err, err
        assert (disk / "d" / "journal.log").read_bytes().endswith(b"\n")
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        out = search_json("--space", str(SMALL), "--sampler", "tpe", "--budget", "40", "--seed", "2", "--runs-dir", str(disk),
                          "--study-name", "d", "--resume")
        assert out["simulations"] == 40
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_unwritable_journal_is_one_line(finished: Path, tmp_path: Path, monkeypatch) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(finished.parent, runs / "f")
    real_open = os.open

    def refuse(path, flags, *args):
        if str(path).endswith("journal.log") and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(journal_module.os, "open", refuse)  # as `chattr +i journal.log` does, even for root
    with pytest.raises(JournalError, match=r"journal.log: cannot .*Operation not permitted.*chattr -i"):
        run_search(SearchOptions(space=str(SMALL), budget=20, runs_dir=str(runs), study_name="f", resume=True))


def test_two_new_searches_on_one_name_at_once(tmp_path: Path) -> None:
    import sys

    from conftest import REPO
    cmd = [sys.executable, "-m", "stageopt.cli", "search", "--space", str(SMALL), "--sampler", "tpe", "--budget", "10", "--no-plots",
           "--json", "--runs-dir", str(tmp_path), "--study-name", "same"]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=180), p.stdout.read(), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 2], results
    err = next(e for rc, _, e in results if rc == 2).strip()
    assert len(err.splitlines()) == 1 and "same" in err and ("--resume" in err or "--join" in err), err
    assert json.loads(next(o for rc, o, _ in results if rc == 0))["simulations"] == 10
