"""Per-GPU memory of a serving instance: weights, activation workspace, and what is left for the KV cache.

Everything is read from the serving blocks: weights are the local weight
tensors of the busiest pipeline stage at the plan's weight dtype; the KV cache
per token is the cache tensors of the attention block
(:func:`~stageopt.serving.step_costs.cache_bytes_per_token`) times the stage's
layers at the KV dtype; the workspace is the largest activation working set of
one op at a full step (``max_tokens`` new tokens) plus fp32 logits for
``max_seqs`` sequences. The cache gets ``memory_utilization`` of HBM (vLLM's
``gpu_memory_utilization``, default 0.9) minus weights and workspace, in pages
of ``page_tokens`` tokens (vLLM's default block size 16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stageopt.serving.step_costs import block_weight_params, cache_bytes_per_token
from stageopt.serving.step_time import StepModel, StepShape

GIB = 1024 ** 3
PAGE_TOKENS = 16
MEMORY_UTILIZATION = 0.9
LOGIT_BYTES = 4


@dataclass(frozen=True)
class InstanceMemory:
    """Bytes per GPU of one instance, and its KV-cache capacity in tokens (whole instance)."""

    weights: float
    workspace: float
    kv_per_token: float  # per GPU, per token of a sequence (all the stage's layers)
    kv_budget: float  # per GPU
    kv_tokens: int  # tokens of context the instance can hold (pages counted whole)

    @property
    def fits(self) -> bool:
        return self.kv_tokens >= PAGE_TOKENS

    def as_gib(self) -> dict[str, float]:
        return {"weights": self.weights / GIB, "workspace": self.workspace / GIB, "kv_cache": self.kv_budget / GIB}


def instance_memory(sm: StepModel, hbm_gib: float, memory_utilization: float = MEMORY_UTILIZATION) -> InstanceMemory:
    pool, arch = sm.pool, sm.arch
    wbytes = sm.wscale * 2
    stage_layers = sm.dense_layers + sm.moe_layers
    attn_d, _ = block_weight_params("attention", arch, sm.vals["attention"])
    mlp_d, _ = block_weight_params("mlp", arch, sm.vals["mlp"])
    per_layer = {"dense": attn_d + mlp_d}
    if sm.moe_layers:
        moe_d, moe_e = block_weight_params("moe", arch, sm.vals["moe"])
        per_layer["moe"] = attn_d + moe_d + moe_e
    body = sm.dense_layers * per_layer["dense"] + sm.moe_layers * per_layer.get("moe", 0.0)
    emb, _ = block_weight_params("embedding", arch, sm.vals["embedding"])
    head, _ = block_weight_params("head", arch, sm.vals["head"])
    edges = emb + head if pool.pp == 1 else max(emb, head)
    weights = (body + edges) * wbytes
    kv_token = cache_bytes_per_token(arch, sm.vals["attention"]) * sm.kvscale * stage_layers
    workspace = _workspace(sm)
    budget = hbm_gib * GIB * memory_utilization - weights - workspace
    per_gpu_tokens = max(budget, 0.0) / kv_token if kv_token > 0 else math.inf
    pages = math.floor(per_gpu_tokens / PAGE_TOKENS)
    # dpa: each rank caches only its own sequences, so the instance holds tp times as many tokens
    tokens = pages * PAGE_TOKENS * sm.ranks_sharing_attention
    return InstanceMemory(weights=weights, workspace=workspace, kv_per_token=kv_token, kv_budget=max(budget, 0.0),
                          kv_tokens=int(min(tokens, 2**62)))


def _workspace(sm: StepModel) -> float:
    """Largest single-op activation set at a full step, plus the logits of a full batch."""
    pool = sm.pool
    full = StepShape.of(pool.max_tokens, 0.0, 1.0, 1.0)
    biggest = 0.0
    for kind in ("attention", "mlp") + (("moe",) if sm.moe_layers else ()):
        share = sm.ranks_sharing_attention if kind == "attention" else (pool.ep if kind == "moe" else 1)
        vals = sm._with(kind, S=np.maximum(full.tokens / share, 1.0), T=np.ones(1))
        acts = sm.tables[kind].evaluate(vals, 1)[3, :, 0]
        biggest = max(biggest, float(acts.max()))
    logits = pool.max_seqs * sm.model.vocab / pool.tp * LOGIT_BYTES
    return biggest + logits
