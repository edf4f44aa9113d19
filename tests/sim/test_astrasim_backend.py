"""The astra-sim backend end to end, with a stand-in binary that replays the traces.

The stand-in takes ASTRA-sim's command line, replays the generated trace set with
``stageopt.astrasim.trace_replay`` (ASTRA-sim's congestion-unaware semantics) and prints
ASTRA-sim's log lines, so the whole path (generate, run in a temp dir, strict
parsing, Estimate) is exercised without the real binary.
"""

import json
import sys
import textwrap

import pytest

from stageopt.cli import main

STAND_IN = textwrap.dedent("""\
    #!{python}
    import sys
    from stageopt.astrasim.trace_replay import replay_trace_set
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    result = replay_trace_set(args["workload-configuration"], args.get("comm-group-configuration"),
                              args["system-configuration"], args["network-configuration"])
    for timing in result.ranks:
        print("[2026-01-01 00:00:00.000] [workload] [info] " + timing.astra_line())
    print("[2026-01-01 00:00:00.000] [system] [warning] Exiting")
""")


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "astra_stand_in"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def simulate(capsys, *extra):
    code = main(["simulate", "--model", "llama3-8b", "--set", "layers=4", "--set", "seq=1024",
                 "--plan", "tp=2 pp=2 mbs=1 gbs=8", "--gpus", "8", "--json", *extra])
    return code, capsys.readouterr()


def test_astra_sim_backend_runs_generated_traces(capsys, stand_in):
    code, out = simulate(capsys, "--backend", "astra-sim", "--astra-sim", str(stand_in))
    assert code == 0, out.err
    est = json.loads(out.out)
    assert est["backend"] == "astra-sim"
    assert est["iteration_time_s"] > 0
    assert 0 < est["mfu"] < 1
    code, out = simulate(capsys, "--backend", "analytical")
    analytical = json.loads(out.out)
    assert est["peak_memory_gib"] == pytest.approx(analytical["peak_memory_gib"], rel=1e-9)


def test_missing_binary_is_one_line_exit_2(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("STAGEOPT_ASTRA_SIM", raising=False)
    code, out = simulate(capsys, "--backend", "astra-sim", "--astra-sim", str(tmp_path / "nope"))
    assert code == 2 and len(out.err.strip().splitlines()) == 1 and "nope" in out.err


def test_crashing_binary_is_reported(capsys, tmp_path):
    bad = tmp_path / "crash"
    bad.write_text("#!/bin/sh\necho '[critical] something broke'\nexit 3\n")
    bad.chmod(0o755)
    code, out = simulate(capsys, "--backend", "astra-sim", "--astra-sim", str(bad))
    assert code == 2 and "exit code 3" in out.err and len(out.err.strip().splitlines()) == 1
