"""The event replay against ASTRA-sim's recorded output (shared/reference/astra-sim/results.json).

Every congestion-unaware run must come within 2% of ASTRA-sim's step time; the
replay in fact reproduces each rank's finish time and exposed communication to
the cycle, and the second test pins that down. Without ``../shared`` beside the
repository the tests skip.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from stageopt.astrasim.trace_replay import ReplayResult, replay_trace_set

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
REFERENCE = SHARED / "reference"
RESULTS = REFERENCE / "astra-sim" / "results.json"
CONFIGS = REFERENCE / "astra-sim" / "configs"


def _runs(aware: bool) -> list[str]:
    if not RESULTS.is_file():
        return []
    runs = json.loads(RESULTS.read_text())
    return sorted(k for k, v in runs.items() if v["binary"].endswith("_Congestion_Aware") == aware)


@pytest.fixture(scope="session")
def trace_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both reference tarballs extracted once per session."""
    if not RESULTS.is_file():
        pytest.skip(f"reference material not available: {REFERENCE}")
    root = tmp_path_factory.mktemp("replay_traces")
    for name in ("stage_8gpu.tar.gz", "astrasim_microbench_8npus.tar.gz"):
        with tarfile.open(REFERENCE / "traces" / name) as tar:
            tar.extractall(root, filter="data")
    return root


_cache: dict[str, ReplayResult] = {}


def _replay(run: str, root: Path) -> tuple[dict, ReplayResult]:
    spec = json.loads(RESULTS.read_text())[run]
    if run not in _cache:
        groups = root / spec["comm_groups"] if spec.get("comm_groups") else None
        _cache[run] = replay_trace_set(root / spec["workload"], groups, CONFIGS / spec["system"], CONFIGS / spec["network"])
    return spec, _cache[run]


@pytest.mark.parametrize("run", _runs(aware=False) or ["<no reference>"])
def test_step_time_within_two_percent(run: str, trace_root: Path) -> None:
    spec, result = _replay(run, trace_root)
    assert abs(result.max_cycles - spec["max_cycles"]) <= 0.02 * spec["max_cycles"]


@pytest.mark.parametrize("run", _runs(aware=False) or ["<no reference>"])
def test_every_rank_matches_astrasim_to_the_cycle(run: str, trace_root: Path) -> None:
    spec, result = _replay(run, trace_root)
    assert [r.cycles for r in result.ranks] == spec["per_rank_cycles"]
    assert [r.exposed_comm_cycles for r in result.ranks] == spec["per_rank_exposed_comm"]


def test_astra_line_format(trace_root: Path) -> None:
    _, result = _replay("microbench_all_reduce_8npus__net_hgx_h100_8npu_switch", trace_root)
    assert result.ranks[3].astra_line() == "sys[3] finished, 55222 cycles, exposed communication 55222 cycles."


@pytest.mark.parametrize("run", _runs(aware=True) or ["<no reference>"])
def test_congestion_aware_run_is_slower_than_unaware_replay(run: str, trace_root: Path) -> None:
    """Congestion can only add time: the unaware replay is a lower bound (within 10% here)."""
    spec, result = _replay(run, trace_root)
    assert result.max_cycles <= spec["max_cycles"] <= 1.10 * result.max_cycles
