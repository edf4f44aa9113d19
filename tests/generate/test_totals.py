"""Totals read back from every written trace equal ``stageopt inspect``'s numbers exactly,
the validator accepts every set in strict mode, and the replay runs each to the end."""

from __future__ import annotations

import pytest

from stageopt.astrasim.trace_replay import replay_trace_set
from stageopt.chakra import validate_trace_dir
from stageopt.parallel.ranks import coords_of, pp_peer
from stageopt.workload.summary import inspect_report

from .matrix import CASES
from .readback import expected_collectives, load_groups, rank_totals

IDS = [f"{c[0][0]}[{c[1]}]{c[3]}" for c in CASES]


def test_matrix_covers_every_axis() -> None:
    text = " ".join(c[1] for c in CASES)
    for item in ("dp=", "tp=", "sp=on", "cp=", "pp=", "vpp=", "ep=", "zero=1", "zero=2", "zero=3",
                 "recompute=full", "recompute=selective", "schedule=gpipe", "schedule=interleaved",
                 "dp_overlap=off"):
        assert item in text, item
    assert len(CASES) >= 30
    assert {c[0][0] for c in CASES} >= {"gpt3-175b", "llama3-8b", "mixtral-8x7b"}
    assert {c[3] for c in CASES} == {"layer", "chunk", "stage"}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_trace_totals_equal_inspect(case, generated) -> None:
    work, out = generated(case)
    plan = work.plan
    report = inspect_report(work)
    groups = load_groups(out)
    assert all(len(m) > 1 for m in groups.values())
    per_stage = plan.gpus // plan.pp
    for rank in range(plan.gpus):
        stage = coords_of(plan, rank)["pp"]
        st = report["stages"][stage]
        got = rank_totals(out, rank, groups)
        assert got.flops == st["flops"]["total"] + st["vector_flops"], f"rank {rank} FLOPs"
        want = expected_collectives(plan, st, rank)  # tier phases of a bucket round bytes up per rank
        assert got.coll_bytes.keys() == want.keys(), f"rank {rank} collectives"
        assert all(got.coll_bytes[k] == pytest.approx(v, rel=1e-7) for k, v in want.items()), f"rank {rank} bytes"
        assert got.sent == st["p2p_bytes"] and got.received == st["p2p_bytes"], f"rank {rank} p2p"
        neighbours = {pp_peer(plan, rank, (stage + d) % plan.pp) for d in (-1, 1)} if plan.pp > 1 else set()
        assert got.send_peers <= neighbours and got.recv_peers <= neighbours
        assert got.cpu_ops == 0 and got.zero_comp == 0
        # every compute op of the graph is a node, except kernels without FLOPs (the embedding gather)
        assert got.comp_nodes <= st["ops"]
        assert rank // per_stage == stage


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_validator_and_replay_accept_the_set(case, generated) -> None:
    work, out = generated(case)
    rep = validate_trace_dir(out, strict_order=True)
    assert rep.ok and rep.n_warnings == 0, rep.violations + rep.warnings
    assert rep.n_files == work.plan.gpus
    res = replay_trace_set(out / "workload", out / "comm_groups.json", out / "system.json", out / "network.yml")
    assert len(res.ranks) == work.plan.gpus
    # ranks of one stage run the same program against symmetric peers: same finish time
    per_stage = work.plan.gpus // work.plan.pp
    for stage in range(work.plan.pp):
        cycles = {r.cycles for r in res.ranks[stage * per_stage:(stage + 1) * per_stage]}
        assert len(cycles) == 1, (stage, cycles)
