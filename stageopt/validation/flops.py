"""Training FLOPs per iteration as each source counts them, to read its TFLOP/s and MFU back as time.

Why the source's formula and not ours: a published "TFLOP/s per GPU" is that
source's FLOP count divided by its measured time. Dividing the same count by
our predicted time gives a number comparable with it; using our own FLOP count
would mix a convention difference into the error.

Per token and layer, in units of h^2 (h hidden, s sequence, l layers, V vocab,
g/a query groups over heads, f MLP width), Megatron-LM's model FLOPs are
``12 + 12 g/a + m f/h + 12 s/h c`` with ``m`` 18 for gated MLPs and 12 for
plain ones and ``c`` 1 (full score matrix) or 1/2 (causal); the output layer
adds ``6 V / (l h)``. For GPT (g = a, f = 4h) this is
``72 (1 + s/6h + V/12lh)`` (Korthikanti et al. 2022, sec. 6). Narayanan et al.
2021 (eq. 3) count full recomputation as a fourth pass of every layer:
``96 (1 + s/6h + V/16lh)``.
"""

from __future__ import annotations

from stageopt.model.spec import ModelSpec

FORMULAS = ("megatron", "megatron-causal", "narayanan-recompute")


def source_flops(model: ModelSpec, global_batch: int, formula: str) -> float:
    """FLOPs of one iteration of ``global_batch`` sequences under the named convention."""
    if formula not in FORMULAS:
        raise ValueError(f"FLOP formula {formula!r} unknown; use one of {', '.join(FORMULAS)}")
    h, s, l, v = model.hidden, model.seq, model.layers, model.vocab
    gated = model.activation == "swiglu"
    width = model.top_k * model.expert_ffn if model.is_moe else model.ffn
    attention = 12 * s / h * (0.5 if formula == "megatron-causal" else 1.0)
    layer = 12 + 12 * model.kv_heads / model.heads + (18 if gated else 12) * width / h + attention
    if formula == "narayanan-recompute":
        layer *= 4 / 3
    head = 6 * v / (l * h)
    return global_batch * s * l * h * h * (layer + head)
