"""How long one engine step takes: the serving blocks priced by the shared kernel and network models.

A step is described by four totals over the sequences it runs (arrays: one
entry per step, so a simulation or a search prices many steps in one call):
``tokens`` (new tokens: prompt chunks plus one per decode), ``pairs``
(query-key pairs attention computes; causal within a chunk), ``keys`` (cached
keys attention reads) and ``sampled`` (sequences that produce a token).

Every kernel is priced by :func:`stageopt.hardware.kernels.kernel_seconds`
(the one kernel model), every collective and pipeline message by
:mod:`stageopt.hardware.network`. One choice is serving's own: attention is
priced as the slower of its FLOPs (the flash-attention kernel) and its HBM
traffic (a streaming kernel over the KV cache), because a decode step's
attention is a batch of matrix-vector products bound by reading the cache.

Parallelism inside an instance: layers split over ``pp`` stages (the slowest
stage sets the pace; a token crosses every stage); ``tp`` splits attention
heads and MLP columns (all-reduce after each row-parallel projection); with
``dpa`` attention runs unsplit, each rank on its share of the sequences, and the
hidden states are all-gathered over the ``tp`` ranks before the MLP; MoE layers
run ``tp / ep``-way split experts on ``ep`` ranks, each EP rank bringing its
share of the tokens (the graph's capacity rule), and read only the experts a
step's tokens reach (uniform routing: ``1 - (1 - k/E)^tokens`` of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from stageopt.graph.symbols import symbol_values
from stageopt.hardware import Hardware
from stageopt.hardware.kernels import HIGH, KERNEL_CODES, LOWP, Kernels, grouped_kernel_seconds
from stageopt.hardware.kernels import kernel_seconds as _kernel_seconds
from stageopt.hardware.network import collective_time, pipeline_path_time
from stageopt.model.spec import ModelSpec
from stageopt.serving.cache_graph import inference_arch
from stageopt.serving.serve_plan import DTYPES, Pool
from stageopt.serving.step_costs import BlockTable, block_table

ACT_BYTES = 2


@dataclass(frozen=True)
class StepShape:
    """Totals of one or many steps of an instance (arrays of equal length)."""

    tokens: np.ndarray
    pairs: np.ndarray
    keys: np.ndarray
    sampled: np.ndarray

    @staticmethod
    def of(tokens, pairs, keys, sampled) -> "StepShape":
        arrays = [np.atleast_1d(np.asarray(x, dtype=float)) for x in (tokens, pairs, keys, sampled)]
        n = max(len(a) for a in arrays)
        return StepShape(*[np.broadcast_to(a, (n,)) for a in arrays])


def kernel_seconds(hw: Hardware, dtype: str, kern: Kernels) -> np.ndarray:
    """The shared kernel model as serving engines run it: steps replayed from CUDA graphs."""
    return _kernel_seconds(hw, dtype, kern, cuda_graphs=True)


def _kernels(code: int, flops, nbytes, shape, precision: int, launches: float = 1.0) -> Kernels:
    """Forward kernels of one op for the shared kernel model (``shape``: GEMM m, n, k, batch rows, or None)."""
    flops = np.asarray(flops, dtype=float)
    zero = np.zeros_like(flops)
    m, n, k, batch = (zero, zero, zero, zero) if shape is None else shape
    return Kernels(code=np.full(flops.shape, code), flops=flops, nbytes=np.asarray(nbytes, dtype=float), m=m, n=n,
                   k=k, batch=batch, precision=np.full(flops.shape, precision), backward=np.zeros(flops.shape, bool),
                   count=launches)


def _fused_gemm_seconds(hw: Hardware, dtype: str, members: list[Kernels], label: int) -> np.ndarray:
    """Seconds of one fused GEMM made of ``members`` (the shared kernel model's grouping rule)."""
    stacked = Kernels(**{f: np.stack([np.broadcast_to(np.asarray(getattr(k, f), dtype=float), members[0].flops.shape)
                                      for k in members]) for f in ("flops", "nbytes", "m", "n", "k", "batch")},
                      code=np.zeros((len(members), 1), dtype=int), precision=np.asarray(members[0].precision)[None],
                      backward=np.zeros((len(members), 1), dtype=bool))
    return grouped_kernel_seconds(hw, dtype, stacked, np.full(len(members), label), cuda_graphs=True).sum(axis=0)


def attention_kernel_seconds(hw: Hardware, flops, nbytes, flops_per_score=0.0) -> np.ndarray:
    """An attention kernel: the slower of the flash-attention kernel on its FLOPs (and its scores'
    exponentials) and a stream of its bytes."""
    flops, nbytes = np.broadcast_arrays(np.asarray(flops, dtype=float), np.asarray(nbytes, dtype=float))
    zero = np.zeros_like(flops)
    shape = (zero, zero, np.broadcast_to(np.asarray(flops_per_score, dtype=float), flops.shape), zero)
    compute = kernel_seconds(hw, "bf16", _kernels(KERNEL_CODES["attention"], flops, nbytes, shape, HIGH))
    stream = kernel_seconds(hw, "bf16", _kernels(KERNEL_CODES["vector"], flops, nbytes, None, HIGH))
    return np.maximum(compute, stream)


def _values(model: ModelSpec, tp: int, ep: int) -> dict[str, float]:
    return symbol_values(model, SimpleNamespace(mbs=1, tp=tp, cp=1, ep=ep))


class StepModel:
    """Prices steps of one instance of ``pool`` serving ``model`` on ``hw``."""

    def __init__(self, model: ModelSpec, hw: Hardware, pool: Pool, wdtype: str = "bf16",
                 kvdtype: str = "bf16") -> None:
        self.model, self.hw, self.pool = model, hw, pool
        self.arch = inference_arch(model, pool.tp)
        self.attn_tp = 1 if pool.dpa else pool.tp
        self.ranks_sharing_attention = pool.tp if pool.dpa else 1
        self.wscale = DTYPES[wdtype] / ACT_BYTES
        self.kvscale = DTYPES[kvdtype] / ACT_BYTES
        self.gemm_dtype = "fp8" if wdtype == "fp8" else "bf16"
        self.vals = {"attention": _values(model, self.attn_tp, 1), "mlp": _values(model, pool.tp, 1),
                     "moe": _values(model, pool.tp // pool.ep, pool.ep), "embedding": _values(model, pool.tp, 1),
                     "head": _values(model, pool.tp, 1)}
        self.tables = {k: block_table(k, self.arch) for k in ("attention", "mlp", "embedding", "head")}
        if model.is_moe:
            self.tables["moe"] = block_table("moe", self.arch)
        stage_layers = math.ceil(model.layers / pool.pp)
        self.moe_layers = min(model.moe_layers, stage_layers)
        self.dense_layers = stage_layers - self.moe_layers

    # -- blocks ------------------------------------------------------------------
    def _kernels(self, table: BlockTable, flops_vals: dict, bytes_vals: dict, n: int, degree: dict[str, float],
                 touched: np.ndarray | None = None, part: str = "all") -> np.ndarray:
        """Seconds of a block's ops; ``part`` "core" keeps only attention kernels, "rest" the others."""
        fv = table.evaluate(flops_vals, n)
        bv = table.evaluate(bytes_vals, n)
        total = np.zeros(n)
        fused: dict[int, list[Kernels]] = {}  # fused GEMMs (QKV, gate+up), priced once per group below
        for i, row in enumerate(table.rows):
            if part != "all" and (row.kind.startswith("attention")) != (part == "core"):
                continue
            flops, weights, cache, acts = fv[0, i], bv[1, i], bv[2, i] * self.kvscale, bv[3, i]
            if row.kind == "comm":
                deg = degree.get(row.axis, 1.0)
                if deg > 1:
                    stride = 1.0 if row.axis == "tp" else degree["tp"]
                    total += collective_time(self.hw, row.collective, acts, deg, stride)
                continue
            if row.expert and touched is not None:
                weights = weights * touched
            if row.kind == "matmul":
                # inference FP8 GEMMs take weights quantized offline and activations quantized by the
                # kernel before them: no separate cast kernel (the kernel model's LOWP class)
                precision = LOWP if row.precision != HIGH else HIGH
                gemm = _kernels(0, flops, weights * self.wscale + acts, bv[4:, i], precision, row.launches)
                if row.group >= 0:
                    fused.setdefault(row.group, []).append(gemm)
                    continue
                total += kernel_seconds(self.hw, self.gemm_dtype, gemm)
            elif row.kind == "vector":
                total += kernel_seconds(self.hw, "bf16", _kernels(
                    KERNEL_CODES["vector"], flops, weights + acts + cache, None, HIGH, row.launches))
            else:
                total += attention_kernel_seconds(self.hw, flops, acts + cache, fv[6, i])
        for label, members in fused.items():
            total += _fused_gemm_seconds(self.hw, self.gemm_dtype, members, label)
        return total

    def _with(self, kind: str, **symbols: np.ndarray) -> dict:
        return {**self.vals[kind], "B": 1.0, **symbols}

    def attention_seconds(self, s: StepShape, part: str = "all") -> np.ndarray:
        share = self.ranks_sharing_attention
        tokens = np.maximum(s.tokens / share, 1.0)
        t_flops = (s.pairs / share) / tokens
        t_keys = np.maximum(s.keys / share, 1.0)
        out = self._kernels(self.tables["attention"], self._with("attention", S=tokens, T=t_flops),
                            self._with("attention", S=tokens, T=t_keys), len(tokens), {"tp": self.attn_tp},
                            part=part)
        if self.pool.dpa and self.pool.tp > 1 and part != "core":
            out = out + collective_time(self.hw, "all_gather", s.tokens * self.model.hidden * ACT_BYTES,
                                        self.pool.tp, 1.0)
        return out

    def mlp_seconds(self, s: StepShape, kind: str) -> np.ndarray:
        n = len(s.tokens)
        if kind == "mlp":
            vals = self._with("mlp", S=np.maximum(s.tokens, 1.0), T=np.ones(n))
            return self._kernels(self.tables["mlp"], vals, vals, n, {"tp": self.pool.tp})
        ep = self.pool.ep
        tokens = np.maximum(s.tokens / ep, 1.0)
        vals = self._with("moe", S=tokens, T=np.ones(n))
        m = self.model
        touched = 1.0 - (1.0 - m.top_k / m.experts) ** np.maximum(s.tokens, 1.0)
        return self._kernels(self.tables["moe"], vals, vals, n, {"tp": self.pool.tp / ep, "ep": ep}, touched)

    def edge_seconds(self, s: StepShape) -> tuple[np.ndarray, np.ndarray]:
        """(embedding, output layer and sampling) seconds."""
        n = len(s.tokens)
        emb = self._with("embedding", S=np.maximum(s.tokens, 1.0), T=np.ones(n))
        head = self._with("head", S=np.maximum(s.sampled, 1.0), T=np.ones(n))
        deg = {"tp": self.pool.tp}
        return (self._kernels(self.tables["embedding"], emb, emb, n, deg),
                self._kernels(self.tables["head"], head, head, n, deg))

    # -- a step ------------------------------------------------------------------
    def stage_seconds(self, s: StepShape) -> np.ndarray:
        """Seconds the busiest pipeline stage spends on one step."""
        attn = self.attention_seconds(s)
        layer_dense = attn + self.mlp_seconds(s, "mlp")
        body = self.dense_layers * layer_dense
        if self.moe_layers:
            body = body + self.moe_layers * (attn + self.mlp_seconds(s, "moe"))
        emb, head = self.edge_seconds(s)
        if self.pool.pp == 1:
            return body + emb + head
        return body + np.maximum(emb, head)

    def step_seconds(self, s: StepShape) -> np.ndarray:
        """Seconds from a step's start to its tokens: every stage plus the messages between them."""
        stage = self.stage_seconds(s)
        pp = self.pool.pp
        if pp == 1:
            return stage
        return pp * stage + pipeline_path_time(self.hw, s.tokens * self.model.hidden * ACT_BYTES, self.pool.tp, pp)
