"""Fast step times for the request simulation: the step model tabulated where it is tabulable.

A simulation prices one step at a time, thousands of times; evaluating every
block's ops per step would cost milliseconds. Everything except the attention
core depends on the step's token count alone (or, for the output layer, on
the sequences sampled), so :class:`StepTimer` evaluates it once for every count
up to the instance's caps. The attention core depends on the step's
query-key pairs and cached keys; its FLOPs and bytes are linear in them (read
from the graph at one pair, one query token and one key), and each step prices
them with the same kernel function the step model uses. A test checks that
the timer equals :meth:`StepModel.step_seconds`.
"""

from __future__ import annotations

import numpy as np

from stageopt.hardware.network import pipeline_path_time
from stageopt.serving.step_time import ACT_BYTES, StepModel, StepShape, attention_kernel_seconds


class StepTimer:
    """``seconds(tokens, pairs, keys, sampled)`` of one instance for scalar step totals."""

    def __init__(self, sm: StepModel, max_tokens: int, max_seqs: int) -> None:
        self.sm = sm
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        counts = np.arange(1, max_tokens + 1, dtype=float)
        by_tokens = StepShape.of(counts, 0.0, 0.0, 1.0)
        layers = sm.dense_layers + sm.moe_layers
        rest = layers * sm.attention_seconds(by_tokens, part="rest") + sm.dense_layers * sm.mlp_seconds(by_tokens, "mlp")
        if sm.moe_layers:
            rest = rest + sm.moe_layers * sm.mlp_seconds(by_tokens, "moe")
        emb, _ = sm.edge_seconds(by_tokens)
        seqs = np.arange(1, max_seqs + 1, dtype=float)
        _, head = sm.edge_seconds(StepShape.of(1.0, 0.0, 0.0, seqs))
        self.pp = sm.pool.pp
        if self.pp == 1:
            self.by_tokens, self.by_sampled = rest + emb, head
        else:  # the busiest stage holds the embedding or the output layer, whichever is slower
            self.by_tokens, self.by_sampled = rest, head
            self.emb = emb
            self.path = pipeline_path_time(sm.hw, counts * sm.model.hidden * ACT_BYTES, sm.pool.tp, self.pp)
        self.layers = layers
        self._core_coefficients()

    def _core_coefficients(self) -> None:
        sm = self.sm
        table = sm.tables["attention"]
        unit = table.evaluate(sm._with("attention", S=np.ones(1), T=np.ones(1)), 1)[:, :, 0]
        core = [i for i, row in enumerate(table.rows) if row.kind.startswith("attention")]
        self.flops_per_pair = float(sum(unit[0, i] for i in core))
        scores_per_pair = sum(unit[0, i] / unit[6, i] for i in core if unit[6, i] > 0)
        self.flops_per_score = self.flops_per_pair / scores_per_pair if scores_per_pair else 0.0
        self.bytes_per_token = float(sum(unit[3, i] for i in core))
        self.bytes_per_key = float(sum(unit[2, i] for i in core)) * sm.kvscale
        self.share = sm.ranks_sharing_attention

    def seconds(self, tokens: int, pairs: float, keys: float, sampled: int) -> float:
        """Step seconds (from its start to its tokens) for one step's totals."""
        tokens = max(min(int(tokens), self.max_tokens), 1)
        sampled = max(min(int(sampled), self.max_seqs), 1)
        share = self.share
        core = attention_kernel_seconds(
            self.sm.hw, self.flops_per_pair * pairs / share,
            self.bytes_per_token * max(tokens / share, 1.0) + self.bytes_per_key * max(keys / share, 1.0),
            self.flops_per_score)
        stage = self.by_tokens[tokens - 1] + self.layers * float(core) + (
            self.by_sampled[sampled - 1] if self.pp == 1 else 0.0)
        if self.pp == 1:
            return float(stage)
        stage = stage + max(self.emb[tokens - 1], self.by_sampled[sampled - 1])
        return float(self.pp * stage + self.path[tokens - 1])
