"""The plan matrix the generate tests run: every parallel axis, schedule, ZeRO stage and
recompute mode on GPT (tied, biased, LayerNorm, GELU, learned positions), Llama
(GQA, SwiGLU, RoPE) and MoE (Mixtral; DeepSeek-V3 with dense leading layers and a
shared expert) dimensions, cut to a few layers and a short sequence so a case runs
in well under a second."""

from __future__ import annotations

GPT = ("gpt3-175b", ("layers=4", "seq=256"))
LLAMA = ("llama3-8b", ("layers=4", "seq=256"))
LLAMA8 = ("llama3-70b", ("layers=8", "seq=256"))
MIXTRAL = ("mixtral-8x7b", ("layers=4", "seq=256"))
DEEPSEEK = ("deepseek-v3", ("layers=5", "seq=256"))
LLAMA6 = ("llama3-70b", ("layers=6", "seq=256"))
NEMOTRON = ("nemotron-h-8b", ("layers=4", "seq=256", "layer_pattern=mfaf", "ssm_chunk=64"))
GPTOSS = ("gpt-oss-120b", ("layers=4", "seq=256"))
GEMMA = ("gemma3-27b", ("layers=6", "seq=256", "sliding_window=64"))
PARALLEL_GPT = ("gpt3-175b", ("layers=4", "seq=256", "parallel_block=shared_norm"))
NEOX = ("gpt-neox-20b", ("layers=4", "seq=256"))

# (model, overrides, plan, gpus, dp bucket)
CASES: list[tuple[tuple[str, tuple[str, ...]], str, int, str]] = [
    (GPT, "dp=2", 2, "layer"),
    (GPT, "tp=2 sp=on", 2, "layer"),
    (GPT, "tp=2 pp=2 gbs=4", 4, "layer"),
    (GPT, "pp=2 vpp=2 schedule=interleaved gbs=4", 2, "layer"),
    (GPT, "dp=2 zero=1", 2, "chunk"),
    (GPT, "dp=2 zero=2 recompute=full", 2, "layer"),
    (GPT, "dp=2 zero=3 gbs=4", 2, "layer"),
    (GPT, "tp=2 dp=2 recompute=selective framework=megatron-lm-2021", 4, "layer"),  # eager attention
    (GPT, "cp=2 dp=2", 4, "stage"),
    (GPT, "pp=2 dp=2 schedule=gpipe gbs=8 zero=1 framework=torchtitan", 4, "layer"),  # GPipe: torchtitan
    (LLAMA, "tp=2 dp=2 sp=on zero=1", 4, "layer"),
    (LLAMA, "tp=2 pp=2 dp=2 gbs=8", 8, "layer"),
    (LLAMA, "cp=2 tp=2 sp=on", 4, "layer"),
    (LLAMA, "cp=2 dp=2 zero=3", 4, "layer"),
    (LLAMA8, "pp=2 vpp=2 dp=2 gbs=8 schedule=interleaved", 4, "chunk"),
    (LLAMA, "pp=2 recompute=full gbs=4", 2, "layer"),
    (LLAMA, "tp=4 sp=on recompute=selective framework=megatron-lm-2021", 4, "layer"),  # eager attention
    (LLAMA, "dp=4 zero=2 dp_overlap=off", 4, "layer"),
    (LLAMA, "pp=2 dp=2 zero=3 gbs=8", 4, "layer"),
    (LLAMA, "tp=2 cp=2 pp=2 gbs=4 sp=on", 8, "layer"),
    (LLAMA, "pp=4 gbs=8", 4, "layer"),
    (LLAMA8, "pp=2 vpp=2 tp=2 sp=on dp=2 zero=1 gbs=4 schedule=interleaved recompute=full", 8, "layer"),
    (LLAMA, "dp=8 tp=2 zero=1", 16, "chunk"),
    (MIXTRAL, "dp=2 ep=2", 2, "layer"),
    (MIXTRAL, "dp=4 ep=2 zero=1", 4, "layer"),
    (MIXTRAL, "dp=2 ep=2 tp=2 sp=on", 4, "layer"),
    (MIXTRAL, "dp=4 ep=4 zero=3", 4, "layer"),
    (MIXTRAL, "pp=2 dp=2 ep=2 gbs=8", 4, "stage"),
    (MIXTRAL, "cp=2 dp=2 ep=2", 4, "layer"),
    (MIXTRAL, "dp=2 ep=2 recompute=full zero=2", 2, "layer"),
    (MIXTRAL, "pp=2 vpp=2 dp=2 ep=2 gbs=4 schedule=interleaved", 4, "layer"),
    (DEEPSEEK, "pp=2 dp=4 ep=4 tp=2 sp=on zero=1 gbs=8", 16, "layer"),
    # uneven stages, zero-bubble and DualPipe schedules
    (LLAMA6, "pp=2 vpp=2 schedule=interleaved embed_split=on loss_split=on gbs=4", 2, "layer"),
    (DEEPSEEK, "pp=2 dp=2 ep=2 first_layers=3 gbs=4", 4, "layer"),
    (LLAMA8, "pp=4 tp=2 sp=on dp=2 zero=1 gbs=16 schedule=zbh1 framework=hai-llm", 16, "layer"),
    (LLAMA, "pp=2 dp=2 zero=3 recompute=full gbs=8 schedule=zbh1 framework=hai-llm", 4, "layer"),
    (LLAMA8, "pp=2 tp=2 sp=on dp=2 gbs=8 schedule=zbv framework=torchtitan", 8, "chunk"),
    (MIXTRAL, "pp=2 dp=2 ep=2 gbs=8 schedule=dualpipe framework=hai-llm", 4, "layer"),
    (LLAMA8, "pp=4 dp=2 zero=1 gbs=16 schedule=dualpipev framework=torchtitan", 8, "stage"),
    # Mamba-2 hybrids, sliding-window/global attention mixes
    (NEMOTRON, "tp=2 pp=2 sp=on gbs=4", 4, "layer"),
    (GPTOSS, "pp=2 dp=2 ep=2 tp=2 sp=on gbs=4", 8, "layer"),
    (GEMMA, "tp=2 cp=2 sp=on gbs=2 recompute=full", 4, "layer"),
    # parallel attention + MLP blocks: one shared norm (PaLM-style), two norms (GPT-NeoX)
    (PARALLEL_GPT, "tp=2 sp=on dp=2 zero=1", 4, "layer"),
    (NEOX, "tp=2 pp=2 gbs=4 recompute=full", 4, "layer"),
    # context parallelism: Ulysses all-to-all, ring (p2p)
    (LLAMA, "cp=4 dp=2 gbs=4 cp_comm=a2a", 8, "layer"),
    (DEEPSEEK, "tp=2 cp=2 sp=on dp=2 ep=2 gbs=4 cp_comm=a2a", 8, "layer"),
    (LLAMA, "tp=2 cp=2 pp=2 sp=on gbs=4 cp_comm=p2p", 8, "layer"),
]
