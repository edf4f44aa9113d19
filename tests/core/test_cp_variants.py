"""Context-parallel variants: all-gather K/V, ring (p2p) K/V exchange under attention, Ulysses all-to-all."""

import pytest

from stageopt.errors import InfeasiblePlan
from stageopt.graph.block import arch_of
from stageopt.graph.compile import compile_block
from stageopt.graph.symbols import symbol_values
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import simulate_plan
from stageopt.workload import build_workload

LLAMA = ("llama3-8b", ["layers=4", "seq=16384"])


def cp_collectives(plan: Plan):
    model = load_model(*LLAMA)
    block = compile_block("dense", arch_of(model, plan), "none")
    vals = block.evaluate(symbol_values(model, plan))
    return [(c.kind, c.phase, vals[block.names[c.index]]) for c in block.collectives if c.axis == "cp"]


def test_ulysses_trades_the_sequence_split_for_a_head_split():
    """Four all-to-alls forward (q, k, v in; attention out), four backward; each moves a rank's whole shard:
    q (32 heads x 128) and k, v (8 KV heads x 128) for S/cp tokens, in bf16. Nothing is gathered."""
    s, cp = 16384, 4
    got = cp_collectives(Plan(cp=cp, mbs=1, cp_comm="a2a"))
    q = s // cp * 32 * 128 * 2
    kv = s // cp * 8 * 128 * 2
    assert sorted(got) == sorted([("all_to_all", "fwd", b) for b in (q, kv, kv, q)] +
                                 [("all_to_all", "bwd", b) for b in (q, kv, kv, q)])


def test_ring_moves_what_all_gather_moves():
    ring, gather = cp_collectives(Plan(cp=4, mbs=1, cp_comm="p2p")), cp_collectives(Plan(cp=4, mbs=1))
    assert ring == gather and {k for k, _p, _b in ring} == {"all_gather", "reduce_scatter"}


NO_TILE_COST = ("gpu.efficiency.attention_forward.tile_us=0", "gpu.efficiency.attention_backward.tile_us=0")


def test_ring_hides_kv_exchange_under_attention_in_both_simulators():
    """Pass-KV ring: cp - 1 of cp K/V blocks move while attention runs on the previous one. It calls the
    attention kernel once per block, so it wins outright where its tiles cost nothing more."""
    out = {}
    for comm in ("all_gather", "p2p"):
        plan = f"cp=4 dp=2 mbs=1 gbs=4 cp_comm={comm}"
        for sim in (None, ReplaySimulator()):
            _w, est = simulate_plan(LLAMA[0], plan, 8, model_set=LLAMA[1], simulator=sim, hw_set=NO_TILE_COST)
            out[(comm, est.backend)] = est
    for backend in ("analytical", "replay"):
        ring, gather = out[("p2p", backend)], out[("all_gather", backend)]
        assert ring.time_breakdown_s["exposed_cp_comm"] < 0.5 * gather.time_breakdown_s["exposed_cp_comm"]
        assert ring.iteration_time_s < gather.iteration_time_s


def test_the_ring_pays_its_extra_attention_tiles():
    """Four layers, 32 heads, 16K tokens over cp 4, one micro-batch a rank: the ring runs each rank's 4,096
    query rows against four K/V blocks in four calls, 3 x 32 x 4096 / 128 = 3,072 tiles a layer and pass
    more than the all-gather's one call, each at the preset's tile cost over H100's 132 SMs."""
    extra = {}
    for comm in ("all_gather", "p2p"):
        plan = f"cp=4 dp=2 mbs=1 gbs=2 cp_comm={comm}"
        with_tiles = simulate_plan(LLAMA[0], plan, 8, model_set=LLAMA[1])[1].time_breakdown_s["compute"]
        without = simulate_plan(LLAMA[0], plan, 8, model_set=LLAMA[1], hw_set=NO_TILE_COST)[1]
        extra[comm] = with_tiles - without.time_breakdown_s["compute"]
    eff = load_hardware("h100-sxm").gpu.efficiency
    per_tile = (eff.attention_forward.tile_us + eff.attention_backward.tile_us) * 1e-6 / 132
    slowest = eff.slowest_gpu_slowdown(8)
    assert extra["p2p"] - extra["all_gather"] == pytest.approx(4 * 3072 * per_tile * slowest, rel=1e-6)


def test_ulysses_needs_heads_divisible_by_tp_times_cp():
    with pytest.raises(InfeasiblePlan, match="tp\\*cp = 16"):
        build_workload(load_model(*LLAMA), Plan(tp=2, cp=8, mbs=1, cp_comm="a2a"), None)
    assert Plan.parse("cp=2 cp_comm_type=p2p").cp_comm == "p2p"
    assert Plan.parse("cp=1 cp_comm=a2a").cp_comm == "all_gather"  # canonical: nothing to exchange
