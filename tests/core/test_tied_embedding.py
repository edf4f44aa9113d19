"""A tied input/output embedding's gradient, all-reduced between the first and the last pipeline stage.

With pp > 1 the first stage holds the input embedding and the last the output layer that shares its
weight; every step, once gradients are reduced over data parallelism, the two all-reduce that weight's
gradient (Megatron's ``_allreduce_word_embedding_grads``), and the optimizer waits for it. On two ranks a
ring all-reduce is two steps, each paying the link latency, and moves the whole buffer once:

    t = 2 x latency + vocab / tp x hidden x grad_bytes / (scale-out bandwidth x efficiency)

when the two stages sit on different nodes (one rank of the pair per node).
"""

from __future__ import annotations

import numpy as np
import pytest

from stageopt.hardware import load_hardware
from stageopt.parallel.plan import Plan
from stageopt.parallel.ranks import EMBEDDING_GROUP, all_groups, group_members, group_stride
from stageopt.program.nodes import COLL
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.analytical_tail import tied_sync
from stageopt.sim.run import workload_for

MODEL = ("gpt3-175b", ["layers=8", "hidden=2048", "heads=16", "kv_heads=16", "ffn=8192", "vocab=50304", "seq=2048"])


def test_the_group_pairs_each_first_stage_rank_with_its_last_stage_peer():
    plan = Plan.parse("tp=2 pp=4 dp=2")
    per_stage = plan.gpus // plan.pp
    rows = all_groups(plan, EMBEDDING_GROUP)
    assert rows.tolist() == [[r, r + 3 * per_stage] for r in range(per_stage)]
    assert group_members(plan, EMBEDDING_GROUP, 13) == [1, 13] and group_stride(plan, EMBEDDING_GROUP) == 12
    assert all_groups(Plan.parse("tp=2 pp=1 dp=2"), EMBEDDING_GROUP).size == 0


def test_the_analytical_tail_charges_one_two_rank_all_reduce_on_the_end_stages():
    hw = load_hardware("h100-sxm")
    vocab, hidden, tp, grad_bytes = 50304, 2048, 8, 4
    c = {k: np.array([v]) for k, v in dict(tp=tp, cp=1, dp=2, pp=4).items()}
    params = vocab * hidden / tp
    outer = hw.tiers[1]
    # NCCL's ring over two nodes, one rank each: 2 network steps at the tree's hop latency (ppn = 1), Simple's
    # base latency, its multi-node all-reduce plateau (x1.4), and half the buffer each way at the NIC's rate
    by_hand = 1.4 * (8.4 + 2 * 14.0) * 1e-6 + params * grad_bytes / (outer.bandwidth_gbps * 1e9 * outer.efficiency)
    assert tied_sync(hw, {"embedding": 1}, c, params, grad_bytes)[0] == pytest.approx(by_hand)
    assert tied_sync(hw, {"head": 1}, c, params, grad_bytes)[0] == pytest.approx(by_hand)
    assert tied_sync(hw, {"dense": 4}, c, params, grad_bytes)[0] == 0  # a middle stage holds neither end
    assert tied_sync(hw, {"embedding": 1}, {**c, "pp": np.array([1])}, params, grad_bytes)[0] == 0
    assert tied_sync(hw, {"embedding": 1}, c, 0.0, grad_bytes)[0] == 0  # untied


@pytest.mark.parametrize("tied", [True, False])
def test_the_end_stages_reduce_the_shared_weight_before_the_optimizer(tied):
    sets = [*MODEL[1], f"tied_embeddings={'true' if tied else 'false'}"]
    work = workload_for(MODEL[0], "tp=2 pp=4 dp=2 mbs=1 gbs=8 zero=1", None, model_set=sets)
    plan = work.plan
    for stage in range(plan.pp):
        nodes = build_stage_program(work, stage).nodes
        found = [i for i, n in enumerate(nodes) if n.name == "tied_embedding_grads"]
        if not tied or stage not in (0, plan.pp - 1):
            assert not found
            continue
        (i,) = found
        node = nodes[i]
        assert node.type == COLL and node.group == EMBEDDING_GROUP and node.group_size == 2
        assert node.collective == "all_reduce" and node.comm_size == 50304 * 2048 // 2 * plan.grad_bytes
        optimizer = next(n for n in nodes if n.name == "optimizer")
        assert i in optimizer.data_deps + optimizer.ctrl_deps


@pytest.mark.parametrize("mtp", [1, 0])
def test_multi_token_prediction_shares_the_embedding_with_the_first_stage(mtp):
    """DeepSeek-V3's MTP modules embed again on the last stage: Megatron all-reduces that weight too."""
    sets = ["layers=8", f"mtp_layers={mtp}"]
    work = workload_for("deepseek-v3", "tp=2 pp=4 dp=2 ep=2 etp=1 mbs=1 gbs=8", None, model_set=sets)
    assert not work.model.tied_embeddings
    found = {stage: [n for n in build_stage_program(work, stage).nodes if n.name == "tied_embedding_grads"]
             for stage in range(work.plan.pp)}
    expected = {0, 3} if mtp else set()
    assert {s for s, nodes in found.items() if nodes} == expected
    for stage in expected:
        (node,) = found[stage]
        assert node.comm_size == work.model.vocab * work.model.hidden // 2 * work.plan.grad_bytes
