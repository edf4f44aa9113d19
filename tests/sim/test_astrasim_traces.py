"""The traces ASTRA-sim runs carry stageopt's cost model: kernel times, collective structure, configs.

Independent checks: the durations written into each compute node against
``node_durations`` (the replay's own numbers) with a bound derived from the
rounding rule; a hand-computed rounding case; a doubled kernel model showing
up in the files; and stageopt's cycle-exact ASTRA-sim replay (``stageopt
replay``, which reproduces the real binary's reference runs to the cycle) on
the written set against ``--backend replay --dp-stream shared``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stageopt.program.durations as durations_module
from stageopt.astrasim.configs import RemoteMemoryConfig, read_memory_config
from stageopt.astrasim.trace_replay import replay_trace_set
from stageopt.chakra import NodeType, read_comm_groups, read_trace
from stageopt.errors import ConfigError
from stageopt.hardware import load_hardware
from stageopt.program import build_programs
from stageopt.program.chakra_emit import compute_micros
from stageopt.program.durations import node_durations
from stageopt.program.generate import generate
from stageopt.program.nodes import COMP, ProgramNode, StageProgram
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan, workload_for

SMALL = ("layers=4", "seq=512")


def _comp_durations(path: Path) -> list[int]:
    return [n.duration_micros for n in read_trace(path).nodes if n.type == NodeType.COMP_NODE]


def test_running_sum_rounding_by_hand() -> None:
    nodes = tuple(ProgramNode(i, f"k{i}", COMP, "fwd", ctrl_deps=(i - 1,) if i else ()) for i in range(3))
    program = StageProgram(stage=0, nodes=nodes)
    # three 2.4 us kernels: rounding each gives 2+2+2 = 6 us (1.2 us short); the running sum 2.4, 4.8, 7.2
    # rounds to 2, 5, 7, so the kernels get 2, 3, 2 us and the stream ends 0.2 us early
    assert compute_micros(program, np.full(3, 2.4e-6)).tolist() == [2, 3, 2]
    assert compute_micros(program, np.array([0.4e-6, 0.4e-6, 0.4e-6])).tolist() == [0, 1, 0]


def test_compute_nodes_carry_the_kernel_model_within_the_rounding_bound(tmp_path: Path) -> None:
    work = workload_for("llama3-8b", "tp=2 pp=2 dp=2 mbs=1 gbs=8", 8, model_set=SMALL)
    hw = load_hardware("h100-sxm")
    generate(work, hw, tmp_path)
    assert json.loads((tmp_path / "system.json").read_text())["roofline-enabled"] == 0
    for stage, rank in ((0, 0), (1, 4)):
        program = build_programs(work)[stage]
        model_us = node_durations(program, work, hw)[[n.id for n in program.nodes if n.type == COMP]] * 1e6
        written = np.array(_comp_durations(tmp_path / f"workload.{rank}.et"), dtype=float)
        assert len(written) == len(model_us) > 100
        assert np.abs(written - model_us).max() < 1.0  # each kernel within 1 us of the model
        assert np.abs(np.cumsum(written) - np.cumsum(model_us)).max() <= 0.5 + 1e-6  # the stream within 0.5 us
        assert np.abs(np.rint(model_us).sum() - model_us.sum()) > 0.5  # rounding each kernel alone would drift


def test_a_change_to_the_kernel_model_reaches_the_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = workload_for("llama3-8b", "tp=2 mbs=1 gbs=2", 2, model_set=SMALL)
    hw = load_hardware("h100-sxm")
    generate(work, hw, tmp_path / "base")
    real = durations_module.chunked_kernel_seconds
    monkeypatch.setattr(durations_module, "chunked_kernel_seconds", lambda *a, **k: 3 * real(*a, **k))
    generate(work, hw, tmp_path / "slow")
    base = sum(_comp_durations(tmp_path / "base" / "workload.0.et"))
    slow = sum(_comp_durations(tmp_path / "slow" / "workload.0.et"))
    assert slow == pytest.approx(3 * base, abs=1)


def test_trace_sets_are_byte_identical(tmp_path: Path) -> None:
    work = workload_for("mixtral-8x7b", "tp=2 ep=2 dp=8 mbs=1 gbs=16 zero=1", 16, model_set=("layers=2", "seq=256"))
    hw = load_hardware("h100-sxm")
    generate(work, hw, tmp_path / "a")
    generate(work, hw, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) == 16 + 5
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_node_spanning_groups_are_written_as_tier_phases(tmp_path: Path) -> None:
    work = workload_for("llama3-8b", "tp=2 dp=8 mbs=1 gbs=8 zero=1", 16, model_set=SMALL)
    generate(work, load_hardware("h100-sxm"), tmp_path)
    groups = read_comm_groups(tmp_path / "comm_groups.json")
    nodes_of = {gid: {r // 8 for r in members} for gid, members in groups.items()}
    # the dp group of rank 0 is 0,2,...,14: 4 members in each of 2 nodes -> groups of 4 in one node, 2 across
    assert sorted({len(m) for m in groups.values()}) == [2, 4]
    assert all(len(nodes_of[g]) == 1 or len(nodes_of[g]) == len(groups[g]) for g in groups)
    assert [0, 2, 4, 6] in groups.values() and [0, 8] in groups.values()


PLANS = [  # (model, plan, gpus): dense, interleaved, cp, MoE ep, ZeRO-3 across nodes, DP in buckets
    ("llama3-8b", "tp=2 pp=2 dp=2 mbs=1 gbs=8", 8),
    ("llama3-8b", "tp=2 pp=2 vpp=2 dp=4 mbs=1 gbs=16 schedule=interleaved", 16),
    ("llama3-8b", "tp=2 cp=2 pp=2 dp=2 mbs=1 gbs=8", 16),
    ("mixtral-8x7b", "tp=2 ep=4 pp=2 dp=4 mbs=1 gbs=8", 16),
    ("llama3-8b", "tp=8 dp=2 mbs=1 gbs=4 zero=3", 16),
    ("llama3-8b", "pp=2 dp=4 mbs=1 gbs=8 zero=1", 8),
    ("llama3-8b", "dp=8 mbs=1 gbs=16 zero=1 offload_layers=2", 8),  # host copies: MEM nodes on the CPU slot
]


@pytest.mark.parametrize(("model", "plan", "gpus"), PLANS, ids=[p[1] for p in PLANS])
def test_astra_sim_semantics_reproduce_the_replay(tmp_path: Path, model: str, plan: str, gpus: int) -> None:
    """ASTRA-sim's rules (cycle-exact replay of the written set) = the replay with ASTRA-sim's one comm slot
    and whole TP collectives (the trace is the same with TP overlap on or off)."""
    work, est = simulate_plan(model, f"{plan} tp_overlap=off", gpus, model_set=("layers=4", "seq=1024"),
                              simulator=ReplaySimulator(dp_stream="shared"))
    generate(work, load_hardware("h100-sxm"), tmp_path)
    astra = replay_trace_set(tmp_path / "workload", tmp_path / "comm_groups.json", tmp_path / "system.json",
                             tmp_path / "network.yml", memory_path=tmp_path / "memory.json").max_cycles * 1e-9
    # 0.5%: a direct all-to-all through a switch is written one message at a time (direct1), which pays
    # the latency per peer where the model pays it once; on these 4-layer models that shows
    assert astra == pytest.approx(est.iteration_time_s, rel=0.005)


@pytest.mark.parametrize("text, says", [
    ('{"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": 0}', "remote-mem-bw"),
    ('{"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": 64, "remote-mem-latency": -1}', "remote-mem-latency"),
    ('{"memory-type": "HBM"}', "memory-type"),
    ('[1, 2]', "JSON object"),
])
def test_malformed_remote_memory_files_are_one_line_errors(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "memory.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        read_memory_config(path)


def test_remote_memory_access_time_is_astra_sims_integer_nanoseconds() -> None:
    # the analytical remote-memory backend: latency + size / bandwidth (GB/s = bytes per ns), truncated
    memory = RemoteMemoryConfig(memory_type="PER_NPU_MEMORY_EXPANSION", latency_ns=5, bandwidth_gbps=64)
    assert memory.access_ns(1_000_000) == 5 + 15625
    assert memory.access_ns(100) == 5 + 1
