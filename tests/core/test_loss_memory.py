"""Memory of the loss, by how the stack computes cross-entropy, per logit (mbs x seq x vocab / tp).

Hand-derived: Transformer Engine's fused cross-entropy writes the gradient into
the bf16 logits in place (2 bytes a logit, kept and at peak); flash-attn's fused
loss (llm-foundry) keeps the bf16 logits and returns a new bf16 gradient (2 kept,
4 at peak); Megatron's
vocab-parallel cross-entropy, unfused or in Megatron-Core's native fused kernels,
keeps an fp32 softmax (4) beside which the bf16 logits sit at its peak (6); PyTorch's ``F.cross_entropy(logits.float())`` keeps
an fp32 log-softmax (4) and in backward also holds the fp32 gradient it receives
and the one it returns (12).
"""

from __future__ import annotations

import pytest

from stageopt.sim.run import simulate_plan

GIB = 2**30


@pytest.mark.parametrize("framework, bytes_per_logit", [("megatron-core", 2), ("llm-foundry", 4),
                                                        ("megatron-lm-2021", 6), ("nemo-2024", 6),
                                                        ("torchtitan", 12)])
def test_the_loss_holds_what_its_cross_entropy_keeps(framework, bytes_per_logit):
    # one GPU, no ZeRO and no recompute: "other" memory is the loss alone
    _, est = simulate_plan("llama3-8b", f"tp=1 pp=1 dp=1 mbs=2 gbs=2 recompute=none framework={framework}", None,
                           model_set=["layers=2", "seq=4096"])
    logits = 2 * 4096 * 128256
    assert est.memory_breakdown_gib["other"] * GIB == pytest.approx(bytes_per_logit * logits, rel=1e-9)
