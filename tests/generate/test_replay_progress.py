"""Replay progress counts trace nodes: it rises to exactly the nodes in the trace files, and
reporting it leaves the replayed times unchanged."""

from __future__ import annotations

import io

from stageopt.astrasim.configs import read_network_config, read_system_config
from stageopt.astrasim.events import Engine
from stageopt.astrasim.trace_replay import load_programs, replay_programs
from stageopt.chakra import read_comm_groups, read_trace
from stageopt.console import progress

from .matrix import LLAMA

CASE = (LLAMA, "tp=2 pp=2 gbs=4", 8, "layer")  # collectives, pipeline messages and several micro-batches


def test_progress_reaches_every_trace_node_and_keeps_the_times(generated) -> None:
    _work, out = generated(CASE)
    system, network = read_system_config(out / "system.json"), read_network_config(out / "network.yml")
    groups = read_comm_groups(out / "comm_groups.json")
    programs = load_programs(out / "workload", network.num_npus, system)
    nodes_in_files = sum(len(read_trace(out / f"workload.{r}.et").nodes) for r in range(network.num_npus))

    seen: list[int] = []
    engine = Engine(programs, groups, system, network)
    results = engine.run(on_tick=lambda e: seen.append(e.nodes_finished()), every=1)
    assert seen == sorted(seen) and seen[-1] == nodes_in_files  # monotone, ends at every node of every rank
    plain = replay_programs(programs, groups, system, network)
    assert [r.cycles for r in plain.ranks] == [r.finish_ns for r in results]

    shown = io.StringIO()
    with progress(nodes_in_files, "replaying", unit="node", stream=shown, log_interval_s=0, quiet_s=0) as bar:
        Engine(programs, groups, system, network).run(on_tick=lambda e: bar.update(e.nodes_finished() - bar.n),
                                                      every=max(1, nodes_in_files // 4))
    lines = shown.getvalue().splitlines()
    assert len(lines) >= 2 and all(f"/{nodes_in_files} node (" in line for line in lines)
