"""Training FLOPs per iteration vs Narayanan et al. 2021 (Megatron-LM), eq. (3).

The formula counts the whole s x s attention matrix (no causal discount) and
only matrix multiplications; our ``flops`` follow the same convention.
"""

import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload
from stageopt.workload.stats import all_stage_stats, flops_per_iteration


def gpt(layers, hidden, heads, seq=2048, vocab=51200):
    return load_model("gpt3-175b", [f"layers={layers}", f"hidden={hidden}", f"heads={heads}",
                                    f"kv_heads={heads}", f"ffn={4 * hidden}", f"seq={seq}", f"vocab={vocab}"])


def megatron(batch, s, l, h, V, full_recompute):
    if full_recompute:
        return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * batch * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


CASES = [
    # layers, hidden, heads, plan
    (96, 12288, 96, "tp=8 pp=8 dp=4 mbs=1 gbs=1536 recompute=full"),
    (96, 12288, 96, "tp=8 pp=12 dp=2 mbs=1 gbs=1536 recompute=none"),
    (24, 2304, 24, "tp=1 pp=1 dp=32 mbs=4 gbs=512 recompute=full"),
    (40, 6144, 48, "tp=4 pp=4 cp=2 dp=2 mbs=1 gbs=256 recompute=none sp=on"),
    (48, 8192, 64, "tp=8 pp=4 dp=2 vpp=2 schedule=interleaved mbs=1 gbs=64 recompute=selective sp=on"),
    (30, 3072, 32, "tp=2 pp=3 dp=4 mbs=2 gbs=96 zero=3 recompute=full"),
]


@pytest.mark.parametrize("layers, hidden, heads, plan", CASES)
def test_flops_per_iteration_match_megatron_formula(layers, hidden, heads, plan):
    model = gpt(layers, hidden, heads)
    p = Plan.parse(plan)
    work = build_workload(model, p)
    got = flops_per_iteration(work, all_stage_stats(work))
    want = megatron(p.gbs, model.seq, layers, hidden, model.vocab, p.recompute == "full")
    if p.recompute == "selective":  # the attention core runs again: its two s x s matmuls, 4 s^2 h a layer and sample
        want += 4 * p.gbs * model.seq**2 * layers * hidden
    assert got == pytest.approx(want, rel=0.005)


def test_eager_and_flash_attention_count_the_same_flops():
    plan = Plan.parse("tp=2 pp=2 dp=1 mbs=1 gbs=4")
    flash = build_workload(gpt(4, 1024, 16).replace(attention="flash"), plan)
    eager = build_workload(gpt(4, 1024, 16).replace(attention="eager"), plan)
    assert flops_per_iteration(flash, all_stage_stats(flash)) == pytest.approx(
        flops_per_iteration(eager, all_stage_stats(eager)), rel=1e-12)
