"""Upper bounds on the sizes a real training system can have, and the checks that state them.

Why bounds at all: a typo such as ``layers: 1e29`` or ``--gpus 4611686018427387904``
is a valid integer, and without a bound stageopt prints nonsense or spends
hours building a graph for it. Each bound sits far above anything built or
announced (so no real plan is refused) and far below where the arithmetic or
the trace writer stops being usable; the message states the bound and why.
"""

from __future__ import annotations

import math

from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten

MAX_GPUS = 10**7  # the largest announced clusters are ~10^5-10^6 GPUs
MAX_COUNT = 10**8  # the largest bound below (sequences, tokens of context, vocabulary)
MAX_CONFIG_NUMBER = 1e15  # no count, size, rate or price in a config comes near this

# Model sizes: (bound, what real models have). Largest published: 126 layers
# (Llama 3.1 405B), hidden 18,432 (PaLM 540B), vocab 256K, contexts of 10M
# tokens, up to 10^6 experts (PEER).
MODEL_BOUNDS: dict[str, tuple[int, str]] = {
    "layers": (10**5, "real models have at most a few hundred"),
    "hidden": (10**6, "real models have at most ~20,000"),
    "heads": (10**5, "real models have at most a few hundred"),
    "kv_heads": (10**5, "real models have at most a few hundred"),
    "ffn": (10**7, "real models have at most ~100,000"),
    "vocab": (10**8, "real vocabularies have at most ~10^6 tokens"),
    "seq": (10**8, "the longest trained contexts are ~10^7 tokens"),
    "experts": (10**7, "the most experts published is ~10^6"),
    "top_k": (10**7, "it cannot exceed experts"),
    "expert_ffn": (10**7, "real experts have at most ~100,000"),
    "shared_experts": (10**5, "real models share at most a few"),
    "dense_layers": (10**5, "it is below layers"),
    "head_dim": (10**5, "real heads have at most a few hundred"),
    "q_lora_rank": (10**6, "real low-rank query projections have a few thousand"),
    "kv_lora_rank": (10**6, "real key/value latents have a few hundred"),
    "qk_nope_dim": (10**5, "real heads have at most a few hundred"),
    "qk_rope_dim": (10**5, "real heads have at most a few hundred"),
    "v_head_dim": (10**5, "real heads have at most a few hundred"),
    "sliding_window": (10**8, "the longest trained contexts are ~10^7 tokens"),
    "ssm_state": (10**6, "real Mamba-2 states have at most a few hundred per channel"),
    "ssm_heads": (10**5, "real Mamba-2 layers have at most a few hundred heads"),
    "ssm_head_dim": (10**5, "real Mamba-2 heads have at most a few hundred channels"),
    "mtp_layers": (100, "DeepSeek-V3 trains with one multi-token-prediction module"),
    "router_groups": (10**7, "it divides experts"),
    "router_group_topk": (10**7, "it is at most router_groups"),
}

# Plan sizes: degrees are bounded by the GPU count; batches by what fits in a step.
PLAN_BOUNDS: dict[str, tuple[int, str]] = {
    "dp": (MAX_GPUS, "it is a share of at most 10^7 GPUs"),
    "tp": (MAX_GPUS, "it is a share of at most 10^7 GPUs"),
    "cp": (MAX_GPUS, "it is a share of at most 10^7 GPUs"),
    "pp": (MAX_GPUS, "it is a share of at most 10^7 GPUs"),
    "ep": (MAX_GPUS, "it is a share of at most 10^7 GPUs"),
    "vpp": (10**5, "it cannot exceed the layer count"),
    "mbs": (10**8, "a micro-batch is a share of the global batch"),
    "gbs": (10**8, "the largest published global batches are ~10^4-10^5 sequences"),
}


def check_count(value: object, where: str, *, low: int, high: int, why: str = "") -> int:
    """An integer in ``[low, high]`` (bools and floats refused), or a ConfigError stating the bound."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} = {shorten(value)} is not an integer; give a whole number")
    if value < low:
        raise ConfigError(f"{where} = {value} must be at least {low}")
    if value > high:
        reason = f" ({why})" if why else ""
        raise ConfigError(f"{where} = {shorten(value, 30)} is above the bound {high:.0e}{reason}; check for a typo")
    return value


def check_gpus(value: object, where: str = "--gpus") -> int:
    """A GPU count between 1 and :data:`MAX_GPUS`."""
    return check_count(value, where, low=1, high=MAX_GPUS, why="the largest clusters have ~10^6 GPUs")


def check_finite(value: object, where: str, *, high: float = MAX_CONFIG_NUMBER) -> float:
    """A real number (int or float, not bool), finite and at most ``high`` in magnitude."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} = {shorten(value)} is not a number; give a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{where} = {shorten(value, 30)} is not finite; give a finite number")
    if abs(number) > high:
        raise ConfigError(f"{where} = {shorten(value, 30)} is above the bound {high:.0e} no real system reaches; "
                          "check for a typo")
    return number
