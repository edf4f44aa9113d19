"""Per-head query/key norms (Qwen3, Gemma 3, OLMo 2): their parameters, their kernels, their import.

Independent figures: Qwen3-30B-A3B's parameter count, 30,532,122,624 (the Hugging Face checkpoint's
safetensors index: 61,064,245,248 bytes of bf16), which only the two 128-wide norms a layer complete; and the
bytes of Transformer Engine's RMSNorm over each head, counted by hand (read the input, write the output,
read the weight forward; read the gradient and the input, write the input gradient backward).
"""

from __future__ import annotations

import pytest

from stageopt.model.load import from_hf_config
from stageopt.program.stage_program import build_stage_program
from stageopt.sim.run import workload_for

QWEN3_30B = ("layers=48 hidden=2048 heads=32 kv_heads=4 ffn=768 vocab=151936 seq=4096 experts=128 top_k=8 "
             "expert_ffn=768 head_dim=128").split()
PLAN = "tp=1 pp=1 dp=1 mbs=1 gbs=1"


def test_qwen3_parameters_match_the_checkpoint_with_the_query_and_key_norms() -> None:
    with_norms = workload_for("mixtral-8x7b", PLAN, 1, model_set=[*QWEN3_30B, "qk_norm=true"])
    assert with_norms.params_total == 30_532_122_624
    without = workload_for("mixtral-8x7b", PLAN, 1, model_set=QWEN3_30B)
    assert with_norms.params_total - without.params_total == 48 * 2 * 128


def test_the_head_norms_move_their_heads_once_each_way() -> None:
    T, D = 256, 128
    work = workload_for("mixtral-8x7b", PLAN, 1, model_set=[*QWEN3_30B, "layers=1", f"seq={T}", "qk_norm=true"])
    nodes = {(n.phase, n.name.split(":")[-1]): n.tensor_size for n in build_stage_program(work, 0).nodes}
    elems = T * 32 * D + T * 4 * D  # queries and keys of one micro-batch
    # forward (the two norms side by side): input read, output written (bf16), each weight read
    assert nodes[("fwd", "q_head_norm+k_head_norm")] == pytest.approx(2 * 2 * elems + 2 * 2 * D)
    # backward: gradient and input read, input gradient written, each weight's gradient written
    assert nodes[("bwd", "dk_head_norm+dq_head_norm")] == pytest.approx(3 * 2 * elems + 2 * 2 * D)


def test_hugging_face_types_with_query_and_key_norms_import_them() -> None:
    base = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936}
    assert from_hf_config({**base, "model_type": "qwen3"})["qk_norm"] is True
    assert from_hf_config({**base, "model_type": "olmo2"})["qk_norm"] is True
    assert "qk_norm" not in from_hf_config({**base, "model_type": "llama"})
