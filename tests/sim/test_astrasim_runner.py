"""The ASTRA-sim runner: strict parsing of a real log, and every failure mode.

Failures are injected with small stand-in executables (shell scripts written
into tmp_path) so the tests need no ASTRA-sim build.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from stageopt.astrasim.runner import (
    ENV_VAR,
    AstraSimCrashed,
    AstraSimKnownExitFault,
    AstraSimNotFound,
    AstraSimOutputError,
    AstraSimTimeout,
    find_astra_sim,
    parse_astra_sim_output,
    ranks_in_network,
    run_astra_sim,
    scan_log,
)
from stageopt.errors import ConfigError

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
REF = SHARED / "reference" / "astra-sim"
RUN = "dense_dp2_tp2_pp2__roof_switch"
needs_reference = pytest.mark.skipif(not (REF / "outputs").is_dir(), reason="../shared reference not present")

N = 4


def _line(rank: int, cycles: int, exposed: int) -> str:
    return (f"[2026-01-01 00:00:00.000] [workload] [info] sys[{rank}] finished, {cycles} cycles, "
            f"exposed communication {exposed} cycles.")


def _log(ranks: range | list[int] = range(N), exiting: bool = True) -> str:
    lines = []
    for r in ranks:
        lines.append(_line(r, 1000 + 10 * r, 100 + r))
        lines.append(f"[2026-01-01 00:00:00.000] [statistics] [info] sys[{r}], Wall time: {1000 + 10 * r}")
    if exiting:
        lines.append("[2026-01-01 00:00:00.001] [system] [warning] Exiting")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- parsing


@needs_reference
def test_recorded_log_matches_results_json() -> None:
    text = (REF / "outputs" / f"{RUN}.stdout.log").read_text()
    expected = json.loads((REF / "results.json").read_text())[RUN]
    result = parse_astra_sim_output(text, expected["ranks"])
    assert list(result.per_rank_cycles) == expected["per_rank_cycles"]
    assert list(result.per_rank_exposed_comm) == expected["per_rank_exposed_comm"]
    assert result.max_cycles == expected["max_cycles"] == 3148432856
    assert result.step_time_s == pytest.approx(3.148432856)
    assert not result.known_exit_fault


@needs_reference
def test_recorded_log_with_a_lost_line_is_refused() -> None:
    text = (REF / "outputs" / f"{RUN}.stdout.log").read_text()
    damaged = "\n".join(ln for ln in text.splitlines() if "sys[6] finished" not in ln)
    with pytest.raises(AstraSimOutputError, match=r"1 of 8 rank\(s\) \(6\)"):
        parse_astra_sim_output(damaged, 8)


def test_parse_synthetic_log_any_rank_order() -> None:
    text = _log([3, 1, 0, 2])
    result = parse_astra_sim_output(text, N)
    assert result.per_rank_cycles == (1000, 1010, 1020, 1030)
    assert result.per_rank_exposed_comm == (100, 101, 102, 103)
    assert result.max_cycles == 1030


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_log(range(3)), r"lacks the 'finished' line of 1 of 4 rank\(s\) \(3\)"),
        (_log(exiting=False), "no final 'Exiting' line"),
        (_log() + "[x] [system] [critical] bad network config\n", r"\[critical\]"),
        (_log() + _line(2, 5, 1) + "\n", "rank 2 reported twice"),
        (_log().replace("sys[1] finished, 1010 cycles", "sys[1] finished, lots of cycles"), "not understood"),
        (_log() + _line(9, 5, 1) + "\n", r"rank\(s\) 9 but the run has 4"),
        (_log().replace("exposed communication 102", "exposed communication 99999"), "exposed communication"),
        ("Segmentation fault\n\x00\x01garbage", "lacks the 'finished' line of 4 of 4"),
        ("", "lacks"),
    ],
)
def test_bad_output_is_refused(text: str, match: str) -> None:
    with pytest.raises(AstraSimOutputError, match=match):
        parse_astra_sim_output(text, N)


def test_scan_log_reports_everything_it_saw() -> None:
    scan = scan_log(_log(range(2), exiting=True))
    assert scan.finished == {0: (1000, 100), 1: (1010, 101)}
    assert scan.exiting and not scan.critical and not scan.malformed


# ----------------------------------------------------------------------------- running


def _fake(tmp_path: Path, body: str, name: str = "fake_astra") -> Path:
    exe = tmp_path / name
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "inputs"
    d.mkdir()
    for rank in range(N):
        (d / f"workload.{rank}.et").write_bytes(b"")
    (d / "system.json").write_text("{}")
    (d / "network.yml").write_text("topology: [ Switch, Switch ]\nnpus_count: [ 2, 2 ]\n"
                                   "bandwidth: [ 100.0, 10.0 ]\nlatency: [ 500.0, 1000.0 ]\n")
    (d / "memory.json").write_text('{"memory-type": "NO_MEMORY_EXPANSION"}')
    (d / "groups.json").write_text('{"1": [0, 1]}')
    return {"workload": d / "workload", "system": d / "system.json", "network": d / "network.yml",
            "memory": d / "memory.json", "comm_groups": d / "groups.json"}


def _canned(tmp_path: Path, text: str, tail: str = "exit 0", stderr: str = "") -> Path:
    out = tmp_path / "canned.log"
    out.write_text(text)
    err = tmp_path / "canned.err"
    err.write_text(stderr)
    return _fake(tmp_path, f'cat "{out}"\ncat "{err}" >&2\n{tail}')


def test_successful_run_parses_and_uses_own_directory(tmp_path: Path, inputs: dict[str, Path]) -> None:
    record = tmp_path / "record"
    out = tmp_path / "canned.log"
    out.write_text(_log())
    exe = _fake(tmp_path, f'pwd > "{record}.cwd"\nfor a in "$@"; do echo "$a"; done > "{record}.args"\n'
                          f'ps -o pgid= -p $$ > "{record}.pgid"\ncat "{out}"')
    result = run_astra_sim(binary=exe, **inputs)
    assert result.per_rank_cycles == (1000, 1010, 1020, 1030)
    assert result.n_ranks == 4  # from the network's npus_count 2 x 2
    assert result.exit_code == 0 and not result.known_exit_fault and result.wall_s is not None
    cwd = Path((tmp_path / "record.cwd").read_text().strip())
    args = (tmp_path / "record.args").read_text().splitlines()
    assert cwd.name.startswith("stageopt-astrasim-") and not cwd.exists()  # temporary, removed after
    assert f"--logging-folder={cwd / 'log'}" in args
    assert f"--workload-configuration={inputs['workload']}" in args
    assert f"--comm-group-configuration={inputs['comm_groups']}" in args
    assert any(a.startswith("--remote-memory-configuration=") for a in args)
    pgid = int((tmp_path / "record.pgid").read_text())
    assert pgid != os.getpgid(0)  # ran in its own process group


def test_workdir_is_kept_when_given(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log())
    result = run_astra_sim(binary=exe, workdir=tmp_path / "keep", **inputs)
    assert result.max_cycles == 1030 and (tmp_path / "keep").is_dir()


def test_binary_from_environment(tmp_path: Path, inputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _canned(tmp_path, _log())
    monkeypatch.setenv(ENV_VAR, str(exe))
    assert find_astra_sim() == exe.resolve()
    assert run_astra_sim(**inputs).max_cycles == 1030


def test_missing_binary(tmp_path: Path, inputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(AstraSimNotFound, match="--astra-sim PATH or set STAGEOPT_ASTRA_SIM"):
        run_astra_sim(**inputs)
    with pytest.raises(AstraSimNotFound, match="no such file"):
        run_astra_sim(binary=tmp_path / "nope" / "AstraSim", **inputs)
    with pytest.raises(AstraSimNotFound, match="no such command on PATH"):
        find_astra_sim("AstraSim_surely_not_installed_here")


def test_binary_not_executable(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = tmp_path / "astra"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o644)
    with pytest.raises(AstraSimNotFound, match="not executable"):
        run_astra_sim(binary=exe, **inputs)


def test_exit_1_is_a_crash(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log(range(2), exiting=False), tail="exit 1", stderr="terminate: bad trace\n")
    with pytest.raises(AstraSimCrashed, match=r"exit code 1 \(2 of 4 ranks finished; last message: terminate: bad"):
        run_astra_sim(binary=exe, **inputs)


def test_exit_0_with_critical_line(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log() + "[t] [workload] [critical] node 7 has unknown comm type\n")
    with pytest.raises(AstraSimOutputError, match=r"\[critical\] line \(line 10: .*unknown comm type"):
        run_astra_sim(binary=exe, **inputs)


def test_statistics_warning_about_cpu_slot_nodes_is_not_a_failure(tmp_path: Path, inputs: dict[str, Path]) -> None:
    """ASTRA-sim 518bd51 prints this [critical] line from its statistics pass once a rank when a trace holds
    CPU-slot nodes (activation offloading's MEM nodes), after every rank finished; the cycles stand."""
    warning = ("[t] [system] [critical] warning! a callable is removed before call Only GPU and COMM types are "
               "supported for overlap extraction\n")
    exe = _canned(tmp_path, _log(exiting=False) + warning * N + "[t] [system] [warning] Exiting\n")
    result = run_astra_sim(binary=exe, **inputs)
    assert result.max_cycles == 1000 + 10 * (N - 1)


MALLOC = "malloc_consolidate(): unaligned fastbin chunk detected\n"


@pytest.mark.parametrize("tail", ["exit 134", "kill -ABRT $$"])
def test_known_exit_fault_with_all_lines_is_flagged(tmp_path: Path, inputs: dict[str, Path], tail: str) -> None:
    exe = _canned(tmp_path, _log(exiting=False), tail=tail, stderr=MALLOC)
    result = run_astra_sim(binary=exe, **inputs)
    assert result.known_exit_fault and result.exit_code in (134, -6)
    assert result.per_rank_cycles == (1000, 1010, 1020, 1030)
    with pytest.raises(AstraSimKnownExitFault, match="after all 4 ranks finished"):
        run_astra_sim(binary=exe, allow_known_exit_fault=False, **inputs)


def test_known_exit_fault_with_lost_lines_raises(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log([0, 2], exiting=False), tail="exit 134", stderr=MALLOC)
    with pytest.raises(AstraSimKnownExitFault, match=r"2 of 4 ranks' results were lost \(1, 3\)"):
        run_astra_sim(binary=exe, **inputs)


def test_abort_without_the_known_message_is_a_crash(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log(exiting=False), tail="exit 134", stderr="Assertion `x' failed.\n")
    with pytest.raises(AstraSimCrashed, match="exit code 134 .*Assertion"):
        run_astra_sim(binary=exe, **inputs)


def test_timeout_kills_the_whole_group(tmp_path: Path, inputs: dict[str, Path]) -> None:
    pidfile = tmp_path / "child.pid"
    exe = _fake(tmp_path, f'sleep 60 &\necho $! > "{pidfile}"\nwait')
    start = time.monotonic()
    with pytest.raises(AstraSimTimeout, match="ran past its 1 s limit"):
        run_astra_sim(binary=exe, timeout_s=1.0, **inputs)
    assert time.monotonic() - start < 10
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild got SIGKILL; allow a moment for it to be reaped by init
        if not Path(f"/proc/{child}").exists() or "Z" in _proc_state(child):
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in _proc_state(child)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_garbage_output(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, "hello\nthis is not ASTRA-sim\n")
    with pytest.raises(AstraSimOutputError, match="4 of 4"):
        run_astra_sim(binary=exe, **inputs)


def test_missing_inputs_are_named(tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log())
    with pytest.raises(ConfigError, match="network file"):
        run_astra_sim(binary=exe, **{**inputs, "network": tmp_path / "none.yml"})
    with pytest.raises(ConfigError, match=r"trace \(rank 7\)"):
        run_astra_sim(binary=exe, n_ranks=8, **inputs)


def test_ranks_in_network_reference_configs() -> None:
    cfg = REF / "configs"
    if not cfg.is_dir():
        pytest.skip("../shared reference not present")
    assert ranks_in_network(cfg / "net_8npu_2d_ring_switch.yml") == 8
    assert ranks_in_network(cfg / "net_hgx_h100_8npu_switch.yml") == 8


# ----------------------------------------------------------------------------- nothing survives a run


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid):
            return True
        time.sleep(0.05)
    return False


def _setsid_helper(tmp_path: Path, name: str) -> str:
    """Shell lines that start a `setsid` grandchild (a session of its own) and record its pid."""
    return f'setsid sleep 120 </dev/null >/dev/null 2>&1 &\necho $! > "{tmp_path / name}"\n'


def test_timeout_kills_a_setsid_grandchild_and_an_orphaned_one(tmp_path: Path, inputs: dict[str, Path]) -> None:
    orphan = f'sh -c \'setsid sleep 120 </dev/null >/dev/null 2>&1 & echo $! > "{tmp_path / "orphan.pid"}"; sleep 1\' &\n'
    exe = _fake(tmp_path, _setsid_helper(tmp_path, "setsid.pid") + orphan + "sleep 120")
    with pytest.raises(AstraSimTimeout):
        run_astra_sim(binary=exe, timeout_s=3.0, **inputs)
    for name in ("setsid.pid", "orphan.pid"):  # the orphan's parent had exited before the kill
        assert _gone(int((tmp_path / name).read_text())), name


def test_helpers_left_behind_by_a_finished_run_are_killed(tmp_path: Path, inputs: dict[str, Path]) -> None:
    out = tmp_path / "canned.log"
    out.write_text(_log())
    exe = _fake(tmp_path, _setsid_helper(tmp_path, "left.pid") + f'sleep 0.5\ncat "{out}"')
    assert run_astra_sim(binary=exe, **inputs).max_cycles == 1030
    assert _gone(int((tmp_path / "left.pid").read_text()))


def test_sigterm_to_stageopt_simulate_leaves_nothing_running(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    exe = _fake(tmp_path, _setsid_helper(tmp_path, "grandchild.pid") + f'echo $$ > "{tmp_path / "child.pid"}"\n'
                                                                          "sleep 120")
    cmd = [sys.executable, "-m", "stageopt.cli", "simulate", "--model", "llama3-8b", "--set", "layers=2",
           "--set", "seq=256", "--plan", "tp=2 mbs=1 gbs=2", "--gpus", "2", "--backend", "astra-sim",
           "--astra-sim", str(exe)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # let the runner record the grandchild
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    for name in ("child.pid", "grandchild.pid"):
        assert _gone(int((tmp_path / name).read_text())), name


def _peak_rss_mb_of_run(tmp_path: Path, body: str) -> tuple[float, str]:
    import subprocess
    import sys

    exe = _fake(tmp_path, body)
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's (pytest's) peak across exec
    script = ("import sys\nfrom stageopt.astrasim.runner import run_astra_sim\n"
              "from pathlib import Path\nd = Path(sys.argv[2])\ntry:\n"
              "    run_astra_sim(binary=sys.argv[1], workload=d / 'workload', system=d / 'system.json', "
              "network=d / 'network.yml', memory=d / 'memory.json', comm_groups=d / 'groups.json')\n"
              "except Exception as err:\n    print(type(err).__name__, err)\n"
              "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024)\n")
    out = subprocess.run([sys.executable, "-c", script, str(exe), str(tmp_path / "inputs")], capture_output=True,
                         text=True, timeout=900)
    lines = out.stdout.strip().splitlines()
    return float(lines[-1]), "\n".join(lines[:-1])


FLOOD = """import sys
line = int(sys.argv[1])
block = b"x" * (line - 1) + b"\\n" if line < 2**20 else b"x" * 2**20
for _ in range(300 * 2**20 // len(block)):
    sys.stdout.buffer.write(block)
sys.stdout.buffer.write(b"\\n")
"""


@pytest.mark.parametrize("line", [4000, 300 * 2**20], ids=["lines", "one line"])
def test_300_mb_of_output_is_not_held_in_memory(tmp_path: Path, inputs: dict[str, Path], line: int) -> None:
    import sys

    out = tmp_path / "canned.log"
    out.write_text(_log())
    (tmp_path / "flood.py").write_text(FLOOD)
    rss, said = _peak_rss_mb_of_run(tmp_path, f'"{sys.executable}" "{tmp_path / "flood.py"}" {line}\ncat "{out}"')
    assert said == ""  # the complete log after the flood is still read and accepted
    assert rss < 250, f"peak RSS {rss:.0f} MB"


def test_lines_lost_to_the_exit_fault_are_read_from_the_flushed_results_log(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    # the stand-in writes every line to the results log named in the logging configuration (as the
    # synchronous logger does) but loses ranks 1 and 3 on stdout, then aborts as ASTRA-sim 518bd51 does
    full, short = tmp_path / "full.log", tmp_path / "short.log"
    full.write_text(_log(exiting=False))
    short.write_text(_log([0, 2], exiting=False))
    body = ('for a in "$@"; do case "$a" in --logging-configuration=*) cfg="${a#*=}";; esac; done\n'
            'log=$(sed -n \'s/^filename = "\\(.*\\)"/\\1/p\' "$cfg")\n'
            f'cat "{full}" > "$log"\ncat "{short}"\necho "{MALLOC.strip()}" >&2\nexit 134')
    result = run_astra_sim(binary=_fake(tmp_path, body), **inputs)
    assert result.known_exit_fault and result.attempts == 1
    assert result.per_rank_cycles == (1000, 1010, 1020, 1030)


def test_a_run_that_lost_lines_is_repeated(tmp_path: Path, inputs: dict[str, Path]) -> None:
    full, short, count = tmp_path / "full.log", tmp_path / "short.log", tmp_path / "count"
    full.write_text(_log(exiting=False))
    short.write_text(_log([0, 2], exiting=False))
    body = (f'n=$(cat "{count}" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "{count}"\n'
            f'if [ $n -lt 3 ]; then cat "{short}"; else cat "{full}"; fi\necho "{MALLOC.strip()}" >&2\nexit 134')
    exe = _fake(tmp_path, body)
    result = run_astra_sim(binary=exe, **inputs)
    assert result.known_exit_fault and result.attempts == 3 and result.n_ranks == 4
    (count).write_text("-5")
    with pytest.raises(AstraSimKnownExitFault, match=r"in 2 run\(s\) and 2 of 4 ranks' results were lost \(1, 3\)"):
        run_astra_sim(binary=exe, retries=1, **inputs)


def test_a_zero_step_time_is_refused(tmp_path: Path, inputs: dict[str, Path]) -> None:
    text = "".join(_line(r, 0, 0) + "\n" for r in range(N)) + "[x] [system] [warning] Exiting\n"
    with pytest.raises(AstraSimOutputError, match="0 cycles"):
        run_astra_sim(binary=_canned(tmp_path, text), **inputs)


def test_a_segfault_at_teardown_after_every_rank_finished_is_the_known_fault(
        tmp_path: Path, inputs: dict[str, Path]) -> None:
    exe = _canned(tmp_path, _log(exiting=False), tail="kill -SEGV $$")
    result = run_astra_sim(binary=exe, **inputs)
    assert result.known_exit_fault and result.n_ranks == 4
    exe = _canned(tmp_path, _log(range(3), exiting=False), tail="kill -SEGV $$")
    with pytest.raises(AstraSimCrashed, match=r"signal 11 \(3 of 4 ranks finished"):
        run_astra_sim(binary=exe, **inputs)


def test_astra_sims_own_log_pattern_is_read() -> None:
    """Loggers defined by a --logging-configuration print with ASTRA-sim's pattern (level letter, <logger>:)."""
    text = ("[2026-11-23T18:49:55+00:00] [I] <workload>: sys[0] finished, 55222 cycles, exposed communication 5 cycles.\n"
            "[2026-11-23T18:49:55+00:00] [W] <system>: Exiting\n")
    assert parse_astra_sim_output(text, 1).max_cycles == 55222
    with pytest.raises(AstraSimOutputError, match=r"\[critical\] line"):
        parse_astra_sim_output(text + "[2026-11-23T18:49:55+00:00] [C] <system>: bad config\n", 1)
