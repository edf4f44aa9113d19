"""The stage programs encode the schedule, the pipeline messages, gradient sync and ZeRO as
the module docstring of stageopt.program.stage_program promises; group ids and peers agree
with the rank layout; ranks are rendered from one template per stage."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from stageopt.chakra import encode_trace
from stageopt.hardware import load_hardware
from stageopt.parallel.ranks import GROUP_AXES, group_members, pp_peer
from stageopt.parallel.schedule import stage_order
from stageopt.program import ProgramOptions, build_stage_program
from stageopt.program import generate as gen_module
from stageopt.program.chakra_emit import chakra_node, rank_patches
from stageopt.program.groups import GroupTable
from stageopt.program.nodes import COMP, RECV, SEND, StageProgram

from .conftest import workload_of
from .matrix import GPT, LLAMA, LLAMA8, MIXTRAL


def ancestors_of(prog: StageProgram):
    nodes = prog.nodes

    @lru_cache(maxsize=None)
    def anc(i: int) -> frozenset[int]:
        out: set[int] = set()
        for d in nodes[i].data_deps + nodes[i].ctrl_deps:
            out.add(d)
            out |= anc(d)
        return frozenset(out)

    for i in range(len(nodes)):  # fill bottom-up: no deep recursion
        anc(i)
    return anc


def step_of(name: str) -> str:
    """Node names start with <F|B><micro-batch>.<chunk>[.<block>]: (messages have no block)."""
    head = name.split(":")[0]
    return head if head.count(".") == 1 else head.rsplit(".", 1)[0]


@pytest.mark.parametrize("case", [
    (LLAMA8, "pp=2 vpp=2 gbs=4 schedule=interleaved", 2, "layer"),
    (LLAMA, "pp=4 gbs=6", 4, "layer"),
    (GPT, "pp=2 gbs=3 schedule=gpipe recompute=full framework=torchtitan", 2, "layer"),
])
def test_compute_stream_follows_the_schedule(case) -> None:
    work = workload_of(case)
    plan = work.plan
    for stage in range(plan.pp):
        prog = build_stage_program(work, stage)
        comps = [n for n in prog.nodes if n.type == COMP]
        assert comps[-1].name == "optimizer"
        steps: list[str] = []
        for n in comps[:-1]:
            if not steps or steps[-1] != step_of(n.name):
                steps.append(step_of(n.name))
        assert steps == [f"{s.kind}{s.microbatch}.{s.chunk}" for s in stage_order(plan, stage)]
        for prev, node in zip(comps, comps[1:]):  # one stream: each kernel waits for the previous
            assert prev.id in node.ctrl_deps + node.data_deps
        for node in prog.nodes:  # ids are positions; dependencies point backwards
            assert all(d < node.id for d in node.data_deps + node.ctrl_deps)
            assert not set(node.data_deps) & set(node.ctrl_deps)


def test_messages_gate_and_follow_each_chunk() -> None:
    work = workload_of((LLAMA8, "pp=2 vpp=2 gbs=4 schedule=interleaved", 2, "layer"))
    plan = work.plan
    chunks_total = plan.pp * plan.vpp
    for stage in range(plan.pp):
        prog = build_stage_program(work, stage)
        anc = ancestors_of(prog)
        recvs = {step_of(n.name): n for n in prog.nodes if n.type == RECV}
        sends = {step_of(n.name): n for n in prog.nodes if n.type == SEND}
        for s in stage_order(plan, stage):
            key = f"{s.kind}{s.microbatch}.{s.chunk}"
            v = work.chunks[stage][s.chunk].virtual
            needs_recv = v > 0 if s.kind == "F" else v < chunks_total - 1
            needs_send = v < chunks_total - 1 if s.kind == "F" else v > 0
            assert (key in recvs) == needs_recv and (key in sends) == needs_send, key
            comps = [n for n in prog.nodes if n.type == COMP and step_of(n.name) == key]
            if needs_recv:
                r = recvs[key]
                assert r.peer == ("prev" if s.kind == "F" else "next")
                assert all(r.id in anc(c.id) for c in comps)
            if needs_send:
                assert sends[key].peer == ("next" if s.kind == "F" else "prev")
                assert any(c.id in anc(sends[key].id) for c in comps)  # sent once computed
        tags = [(n.type, n.peer, n.tag) for n in prog.nodes if n.type in (SEND, RECV)]
        assert len(tags) == len(set(tags)) and all(t < 500_000_000 for *_, t in tags)


@pytest.mark.parametrize("bucket, count", [("layer", 4 + 2), ("chunk", 1), ("stage", 1)])
def test_gradient_sync_once_per_iteration_overlapping_backward(bucket: str, count: int) -> None:
    work = workload_of((LLAMA, "dp=2 gbs=6 zero=0", 2, bucket))
    prog = build_stage_program(work, 0, ProgramOptions(bucket=bucket))
    anc = ancestors_of(prog)
    dp = [n for n in prog.nodes if n.phase == "dp"]
    assert len(dp) == count and {n.collective for n in dp} == {"all_reduce"}
    opt = next(n for n in prog.nodes if n.name == "optimizer")
    last_b = [n for n in prog.nodes if n.type == COMP and n.name.startswith("B2.")]
    for n in dp:
        assert n.id in anc(opt.id)
        users = [c for c in prog.nodes if c.type == COMP and n.id in anc(c.id)]
        assert users == [opt]  # nothing but the optimizer waits for a gradient bucket
        assert any(c.id in anc(n.id) for c in last_b)  # issued after the last micro-batch's backward
    if bucket == "layer":  # the first bucket is out before the last backward kernel: overlap
        assert dp[0].id < last_b[-1].id


def test_zero3_gathers_each_block_twice_per_microbatch_before_use() -> None:
    work = workload_of((MIXTRAL, "dp=4 ep=2 zero=3 gbs=8", 4, "layer"))
    prog = build_stage_program(work, 0)
    anc = ancestors_of(prog)
    m, blocks = work.plan.microbatches, 1 + 4 + 1  # embedding, 4 MoE layers, head
    gathers = [n for n in prog.nodes if n.collective == "all_gather" and n.phase == "zero3"]
    dense = [n for n in gathers if n.group == "dp_cp"]
    expert = [n for n in gathers if n.group == "edp_cp"]
    assert len(dense) == 2 * m * blocks and len(expert) == 2 * m * 4
    scatters = [n for n in prog.nodes if n.collective == "reduce_scatter" and n.phase == "zero3"]
    assert len(scatters) == m * (blocks + 4)
    first_use = {("F", "dp_cp"): ("q", "logits"), ("F", "edp_cp"): ("expert.gate",)}
    for g in gathers:
        block = g.name.split(":")[0]
        if block.endswith(".0"):
            continue  # the embedding's only reader is the gather kernel, which has no FLOPs and no node
        users = [n for n in prog.nodes if n.type == COMP and n.name.split(":")[0] == block
                 and g.id in anc(n.id)]
        assert users, g.name
        names = first_use.get((block[0], g.group))
        if names:  # the first kernel that reads those weights waits for the gather
            reader = next(n for n in prog.nodes if n.name.split(":")[0] == block and n.name.split(":")[1] in names)
            assert g.id in anc(reader.id)


def test_group_ids_and_peers_follow_the_rank_layout() -> None:
    work = workload_of((MIXTRAL, "tp=2 cp=2 dp=4 ep=2 pp=2 gbs=8", 32, "layer"))
    plan = work.plan
    kinds = ("tp", "cp", "ep", "dp_cp", "edp_cp")
    table = GroupTable(plan, kinds)
    groups = table.comm_groups()
    assert sorted(groups) == list(range(1, len(groups) + 1))
    seen: set[tuple[int, ...]] = set()
    for gid, members in groups.items():
        assert len(members) > 1 and tuple(members) not in seen
        seen.add(tuple(members))
    for rank in range(plan.gpus):
        patches = rank_patches(plan, table, rank)
        for kind in kinds:
            assert groups[int(patches["pg_name"][kind])] == group_members(plan, kind, rank)
        stage = rank // (plan.gpus // plan.pp)
        assert patches["comm_dst"][-2] == pp_peer(plan, rank, (stage + 1) % plan.pp)
        assert patches["comm_src"][-3] == pp_peer(plan, rank, (stage - 1) % plan.pp)
        assert patches["comm_src"][-1] == rank
    # kinds whose groups coincide share ids: with ep=1, expert and dense reduction groups are one
    flat = GroupTable(plan.replace(ep=1), kinds)
    assert flat.id_of("dp_cp", 5) == flat.id_of("edp_cp", 5) and "ep" not in flat.kinds
    assert set(GROUP_AXES) >= set(kinds)


def test_each_stage_is_serialized_once_and_ranks_match_a_direct_encode(tmp_path: Path, monkeypatch) -> None:
    work = workload_of((LLAMA, "tp=2 pp=2 dp=4 gbs=8 zero=1", 16, "layer"))
    calls: list[int] = []
    real = gen_module.stage_template

    def counting(program, micros):
        calls.append(program.stage)
        return real(program, micros)

    monkeypatch.setattr(gen_module, "stage_template", counting)
    gen_module.generate(work, load_hardware("h100-sxm"), tmp_path)
    assert sorted(calls) == [0, 1]
    table = GroupTable(work.plan, ("tp", "dp_cp"))
    programs, micros = gen_module.lowered_programs(work, load_hardware("h100-sxm"))
    for rank in (0, 5, 9, 15):  # encode the real values directly, no template
        prog = programs[rank // 8]
        patches = rank_patches(work.plan, table, rank)
        nodes = []
        for n, m in zip(prog.nodes, micros[rank // 8]):
            node = chakra_node(n, m)
            for a in node.attr:
                if a.name == "pg_name":
                    a.string_val = patches["pg_name"][a.string_val]
                elif a.name in ("comm_src", "comm_dst"):
                    a.int32_val = patches[a.name][a.int32_val]
            nodes.append(node)
        assert (tmp_path / f"workload.{rank}.et").read_bytes() == encode_trace(nodes)
