"""The sympy symbols every shape and cost is written in.

Model symbols are filled from a ModelSpec, ``B`` is the micro-batch size, and
``TP``/``CP``/``EP`` are the degrees of the parallel axes that split tensors.
Pipeline and data parallelism do not split a layer's tensors; they act on the
graph as a whole (see :mod:`stageopt.workload`).
"""

from __future__ import annotations

import sympy as sp

_POS = {"positive": True, "integer": True}

B = sp.Symbol("B", **_POS)  # micro-batch size (sequences)
S = sp.Symbol("S", **_POS)  # sequence length
H = sp.Symbol("H", **_POS)  # hidden size
F = sp.Symbol("F", **_POS)  # dense MLP hidden size
V = sp.Symbol("V", **_POS)  # vocabulary
G = sp.Symbol("G", **_POS)  # key/value heads (query groups)
R = sp.Symbol("R", **_POS)  # query heads per key/value head
D = sp.Symbol("D", **_POS)  # head dimension
E = sp.Symbol("E", **_POS)  # routed experts
K = sp.Symbol("K", **_POS)  # experts per token (top-k)
FE = sp.Symbol("FE", **_POS)  # expert MLP hidden size
NS = sp.Symbol("NS", **_POS)  # shared experts
QL = sp.Symbol("QL", **_POS)  # MLA query low-rank dimension
KL = sp.Symbol("KL", **_POS)  # MLA key/value latent dimension
DN = sp.Symbol("DN", **_POS)  # MLA per-head query/key dimension without rotary embedding
DR = sp.Symbol("DR", **_POS)  # MLA rotary query/key dimension (one shared rotary key per token)
DV = sp.Symbol("DV", **_POS)  # MLA per-head value dimension
SW = sp.Symbol("SW", **_POS)  # sliding attention window (tokens)
SN = sp.Symbol("SN", **_POS)  # Mamba-2 state size per head channel
SH = sp.Symbol("SH", **_POS)  # Mamba-2 heads
SP = sp.Symbol("SP", **_POS)  # Mamba-2 head dimension
SG = sp.Symbol("SG", **_POS)  # Mamba-2 B/C groups
SC = sp.Symbol("SC", **_POS)  # Mamba-2 convolution width
SQ = sp.Symbol("SQ", **_POS)  # Mamba-2 chunk length (state space duality)

TP = sp.Symbol("tp", **_POS)
CP = sp.Symbol("cp", **_POS)
EP = sp.Symbol("ep", **_POS)
CPA = sp.Symbol("cpa", **_POS)  # the all-to-all part of hierarchical context parallelism (1 otherwise)

AXIS_DEGREE: dict[str, sp.Symbol] = {"tp": TP, "cp": CP, "ep": EP, "cpa": CPA}
AXES: tuple[str, ...] = ("tp", "cp", "ep", "cpa")

MODEL_SYMBOLS: tuple[sp.Symbol, ...] = (B, S, H, F, V, G, R, D, E, K, FE, NS, QL, KL, DN, DR, DV,
                                        SW, SN, SH, SP, SG, SC, SQ)
ALL_SYMBOLS: tuple[sp.Symbol, ...] = MODEL_SYMBOLS + (TP, CP, EP, CPA)


def symbol_values(model, plan) -> dict[str, float]:
    """Value of every symbol for one model and plan (keyed by name).

    ``plan`` needs only ``mbs``, ``tp``, ``cp`` and ``ep`` (and ``cpa``, the all-to-all part of
    hierarchical CP, whose ring part ``cp`` is then); they may be numpy arrays (one entry per
    candidate) for the vectorized analytical model.
    """
    return {
        "B": plan.mbs, "S": model.seq, "H": model.hidden, "F": model.ffn, "V": model.vocab,
        "G": model.kv_heads, "R": model.heads // model.kv_heads, "D": model.dim_per_head,
        "E": max(model.experts, 1), "K": max(model.top_k, 1), "FE": max(model.expert_ffn, 1),
        "NS": max(model.shared_experts, 1), "QL": max(model.q_lora_rank, 1), "KL": max(model.kv_lora_rank, 1),
        "DN": max(model.qk_nope_dim, 1), "DR": max(model.qk_rope_dim, 1), "DV": max(model.v_head_dim, 1),
        "SW": max(model.sliding_window, 1), "SN": max(model.ssm_state, 1), "SH": max(model.ssm_heads, 1),
        "SP": max(model.ssm_head_dim, 1), "SG": max(model.ssm_groups, 1), "SC": max(model.ssm_conv, 1),
        "SQ": max(model.ssm_chunk, 1),
        "tp": plan.tp, "cp": plan.cp // getattr(plan, "cpa", 1), "ep": plan.ep, "cpa": getattr(plan, "cpa", 1),
    }
