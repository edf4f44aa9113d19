"""ModelSpec: the architecture of a decoder-only transformer, as plain data.

A spec describes one model and nothing about how it is trained or sharded
(that is :class:`stageopt.parallel.Plan`). It is validated at construction so
every later stage can trust its numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import MODEL_BOUNDS, check_count
from stageopt.model.layer_types import PATTERN_CHARS, kind_parts, layer_kinds

FAMILIES = ("gpt", "llama", "moe")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu", "squared_relu")
ATTENTIONS = ("flash", "eager")
POSITIONS = ("learned", "rope")
ATTENTION_TYPES = ("mha", "mla")
PARALLEL_BLOCKS = ("off", "shared_norm", "two_norms")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """Architecture of a dense or mixture-of-experts decoder.

    ``ffn`` is the hidden size of dense MLP layers; ``expert_ffn`` that of each
    routed (and shared) expert. ``dense_layers`` leading layers of an MoE model
    are dense (DeepSeek-V3 has three). ``attention="eager"`` materializes the
    s x s score matrix (as in Korthikanti et al. 2022); ``"flash"`` keeps only
    the log-sum-exp for backward. ``expert_capacity`` is the tokens the busiest
    expert-parallel rank processes relative to a perfectly balanced share: 1.0
    for force-balanced routing (how benchmark tables run MoE models), the load
    factor of the busiest rank for dropless routing (aux-loss-balanced training
    typically sees 1.1-1.3), or the capacity factor with token dropping (experts
    run padded to it). Expert GEMMs, permutes and all-to-alls scale with it.

    ``attention_type="mla"`` is multi-head latent attention (DeepSeek-V2/V3):
    queries through a ``q_lora_rank`` bottleneck (0: a direct projection),
    keys and values from a ``kv_lora_rank`` latent plus one shared
    ``qk_rope_dim`` rotary key; per head ``qk_nope_dim + qk_rope_dim`` for
    queries and keys, ``v_head_dim`` for values. Its KV cache per token and
    layer is ``kv_lora_rank + qk_rope_dim`` values.

    ``layer_pattern`` names each layer's type, repeated to the model's depth
    (:mod:`stageopt.model.layer_types`: global ``G`` or sliding-window ``L``
    attention, Mamba-2 ``M``/``m``, attention-only ``a``, MLP-only ``f``);
    empty means every layer is ``G``. ``sliding_window`` is the tokens an
    ``L`` layer attends to. Mamba-2 layers (Dao and Gu 2024) have
    ``ssm_heads`` heads of ``ssm_head_dim`` channels, a state of
    ``ssm_state`` per head channel, ``ssm_groups`` groups of B/C projections,
    a causal convolution of width ``ssm_conv`` and chunk length ``ssm_chunk``
    for the state-space-duality algorithm.

    ``mtp_layers`` multi-token-prediction modules (DeepSeek-V3's MTP, Megatron-Core's
    ``--mtp-num-layers``) follow the decoder on the loss stage: each embeds the
    next tokens with the shared embedding, projects them with the hidden state
    (2h -> h), runs one more decoder layer of the model's last kind and predicts
    through the shared output layer with its own loss.

    ``router_groups`` / ``router_group_topk`` (Megatron-Core's ``--moe-router-num-groups`` /
    ``--moe-router-group-topk``, DeepSeek-V3's device-limited routing: 8 and 4) split the experts into
    groups and let each token pick its experts from that many groups; a node-deduplicated dispatch then
    reaches fewer nodes. 0: unlimited.

    ``rope_mscale`` is YaRN's attention scaling of the rotary cos/sin tables (0.1 ln(factor) + 1 where the
    config gives no ``mscale``: 1.3466 for gpt-oss's factor 32). Megatron-Core's fused RoPE kernel takes no
    such factor, so with anything but 1 the rotation runs unfused (``rope_utils.apply_rotary_pos_emb``).

    ``activation_clamp`` bounds a gated activation's two inputs before it (gpt-oss's ``swiglu_limit``
    7.0: the gate at most 7, the linear half within +-7; 0: none). Megatron-Core clamps the experts' fc1
    output eagerly before its fused activation kernel (``weighted_bias_quick_geglu_impl``: two clamps and a
    concatenation forward, their masks and a concatenation of the gradients backward), which moves more
    bytes than the activation itself.

    ``activation``: ``swiglu`` (gated), ``gelu`` or ``squared_relu`` (relu(x)^2, ungated: Nemotron-3 and
    Nemotron-4, Nemotron-H's MLP layers). Whether squared ReLU runs as one compiled kernel or as eager PyTorch is
    the stack's (the ``squared_relu`` fusion of its profile).

    ``qk_norm`` normalizes each head's query and key (RMSNorm over the head dimension) before RoPE: Qwen3,
    Gemma 3 and OLMo 2 (their Hugging Face configs' ``q_norm`` / ``k_norm``; Megatron-Core's ``--qk-layernorm``).

    ``parallel_block`` computes a layer's attention and MLP side by side from the same input,
    ``x + attn(ln(x)) + mlp(ln(x))`` (GPT-J, PaLM, Falcon-7B, MegaScale: ``shared_norm``; GPT-NeoX's parallel
    residual and Falcon-40B/180B normalize each branch on its own: ``two_norms``). Both row-parallel outputs add
    up before one reduction over TP, so a layer reduces once each way instead of twice. ``off``: sequential.
    """

    name: str = "custom"
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    head_dim: int = 0
    norm: str = "rmsnorm"
    activation: str = "swiglu"
    position: str = "rope"
    rope_mscale: float = 1.0
    activation_clamp: float = 0.0
    qk_norm: bool = False
    tied_embeddings: bool = False
    bias: bool = False
    dropout: bool = False
    attention: str = "flash"
    expert_capacity: float = 1.0
    attention_type: str = "mha"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    layer_pattern: str = ""
    sliding_window: int = 0
    ssm_state: int = 0
    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_groups: int = 1
    ssm_conv: int = 4
    ssm_chunk: int = 256
    mtp_layers: int = 0
    router_groups: int = 0
    router_group_topk: int = 0
    parallel_block: str = "off"
    notes: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def dim_per_head(self) -> int:
        """Head dimension; defaults to hidden / heads."""
        return self.head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return sum(kind_parts(k)[1] == "moe" for k in layer_kinds(self)) if self.is_moe else 0

    @property
    def has_ssm(self) -> bool:
        return any(c in self.layer_pattern for c in "Mm")

    @property
    def embedding_on_both_ends(self) -> bool:
        """Whether the input embedding's weight is also used at the end of the model (a tied output layer,
        or the multi-token-prediction modules that embed again): under pipeline parallelism the first and the
        last stage then each hold it and all-reduce its gradient every step (Megatron-Core's
        ``_get_shared_word_embedding_weight``)."""
        return self.tied_embeddings or self.mtp_layers > 0

    def replace(self, **changes: object) -> "ModelSpec":
        return dataclasses.replace(self, **changes)


def _require_count(spec: ModelSpec, names: tuple[str, ...], low: int) -> None:
    """Integers from ``low`` up to the physical bound of :data:`MODEL_BOUNDS` (stated in the error)."""
    for name in names:
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            kind = "a positive" if low > 0 else "a non-negative"
            raise ConfigError(f"model field '{name}' must be {kind} integer, got {shorten(value)}")
        bound, why = MODEL_BOUNDS[name]
        check_count(value, f"model field '{name}'", low=low, high=bound, why=why)


def _require_types(spec: ModelSpec) -> None:
    for name, longest in (("name", 1000), ("notes", 100_000)):
        if not isinstance(getattr(spec, name), str):
            raise ConfigError(f"model field '{name}' must be text, got {shorten(getattr(spec, name))}")
        if len(getattr(spec, name)) > longest:
            raise ConfigError(f"model field '{name}' is {len(getattr(spec, name)):,} characters long; "
                              f"keep it under {longest:,} (it is printed in every report)")
    for name in ("tied_embeddings", "bias", "dropout"):
        if not isinstance(getattr(spec, name), bool):
            raise ConfigError(f"model field '{name}' must be true or false, got {shorten(getattr(spec, name))}")


def _require_choice(spec: ModelSpec, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(spec, name)
    if value not in choices:
        raise ConfigError(f"model field '{name}' must be one of {', '.join(choices)}, got {shorten(value)}")


def _validate(spec: ModelSpec) -> None:
    _require_types(spec)
    _require_count(spec, ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq"), 1)
    _require_count(spec, ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "head_dim",
                          "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim", "sliding_window",
                          "ssm_state", "ssm_heads", "ssm_head_dim", "mtp_layers", "router_groups",
                          "router_group_topk"), 0)
    _require_choice(spec, "family", FAMILIES)
    _require_choice(spec, "norm", NORMS)
    _require_choice(spec, "activation", ACTIVATIONS)
    _require_choice(spec, "attention", ATTENTIONS)
    _require_choice(spec, "position", POSITIONS)
    _require_choice(spec, "attention_type", ATTENTION_TYPES)
    _require_choice(spec, "parallel_block", PARALLEL_BLOCKS)
    _validate_layer_pattern(spec)
    _validate_parallel_block(spec)
    if isinstance(spec.rope_mscale, bool) or not isinstance(spec.rope_mscale, (int, float)) \
            or not 0.5 <= spec.rope_mscale <= 10:
        raise ConfigError(f"model field 'rope_mscale' must be a number in 0.5..10 (1: no YaRN scaling), "
                          f"got {shorten(spec.rope_mscale)}")
    if isinstance(spec.activation_clamp, bool) or not isinstance(spec.activation_clamp, (int, float)) \
            or not 0 <= spec.activation_clamp <= 1e6:
        raise ConfigError(f"model field 'activation_clamp' must be a number >= 0 (gpt-oss's swiglu_limit 7.0; "
                          f"0: no clamp), got {shorten(spec.activation_clamp)}")
    if spec.activation_clamp and spec.activation != "swiglu":
        raise ConfigError(f"model field 'activation_clamp' bounds a gated activation's inputs; activation="
                          f"{spec.activation} has one input: set activation_clamp=0 or activation=swiglu")
    if spec.attention_type == "mla":
        missing = [n for n in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim") if not getattr(spec, n)]
        if missing:
            raise ConfigError(f"model: attention_type=mla needs {', '.join(missing)} > 0 "
                              "(DeepSeek-V3: kv_lora_rank 512, qk_nope_dim 128, qk_rope_dim 64, v_head_dim 128)")
        if spec.kv_heads != spec.heads:
            raise ConfigError(f"model: attention_type=mla has one key/value per head; set kv_heads={spec.heads}")
    if spec.head_dim == 0 and spec.hidden % spec.heads:
        raise ConfigError(f"model: hidden={spec.hidden} is not divisible by heads={spec.heads}; "
                          "set head_dim explicitly or fix heads")
    if spec.router_groups and (spec.experts % spec.router_groups or not 0 < spec.router_group_topk <= spec.router_groups):
        raise ConfigError(f"model: router_groups={spec.router_groups} must divide experts={spec.experts} and "
                          f"router_group_topk={spec.router_group_topk} be 1..router_groups (DeepSeek-V3: 8 and 4)")
    if spec.heads % spec.kv_heads:
        raise ConfigError(f"model: heads={spec.heads} is not divisible by kv_heads={spec.kv_heads}; "
                          "kv_heads must divide heads (grouped-query attention)")
    if spec.family == "moe" or spec.experts:
        if spec.experts < 2 or spec.top_k < 1 or spec.expert_ffn < 1:
            raise ConfigError(f"model: a moe model needs experts >= 2, top_k >= 1 and expert_ffn >= 1 "
                              f"(got experts={spec.experts}, top_k={spec.top_k}, expert_ffn={spec.expert_ffn})")
        if spec.top_k > spec.experts:
            raise ConfigError(f"model: top_k={spec.top_k} exceeds experts={spec.experts}; lower top_k")
        if spec.family != "moe":
            raise ConfigError(f"model: experts={spec.experts} set on family={spec.family}; use family=moe")
        if not 0 < spec.expert_capacity <= spec.experts / spec.top_k:
            raise ConfigError(f"model: expert_capacity={spec.expert_capacity} must be in (0, experts/top_k="
                              f"{spec.experts / spec.top_k:g}]; 1.0 is perfectly balanced routing")
        if spec.dense_layers >= spec.layers:
            raise ConfigError(f"model: dense_layers={spec.dense_layers} must be below layers={spec.layers}")


def _validate_layer_pattern(spec: ModelSpec) -> None:
    pattern = spec.layer_pattern
    if not isinstance(pattern, str) or len(pattern) > 10**5 or any(c not in PATTERN_CHARS for c in pattern):
        raise ConfigError(f"model field 'layer_pattern' must use the characters {PATTERN_CHARS} (G global attention, "
                          f"L sliding-window, M Mamba-2 + MLP, m Mamba-2, a attention, f MLP), got {shorten(pattern)}")
    if "L" in pattern and spec.sliding_window < 1:
        raise ConfigError("model: layer_pattern has sliding-window layers (L) but sliding_window is 0; "
                          "set sliding_window to the window in tokens")
    if spec.has_ssm:
        for name in ("ssm_state", "ssm_heads", "ssm_head_dim", "ssm_groups", "ssm_conv", "ssm_chunk"):
            value = getattr(spec, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 10**6:
                raise ConfigError(f"model: Mamba-2 layers need {name} in 1..1000000, got {shorten(value)}")
        if spec.ssm_heads % spec.ssm_groups:
            raise ConfigError(f"model: ssm_groups={spec.ssm_groups} must divide ssm_heads={spec.ssm_heads}")
        if spec.seq % spec.ssm_chunk:
            raise ConfigError(f"model: seq={spec.seq} must be a multiple of ssm_chunk={spec.ssm_chunk} "
                              "(the state-space-duality chunk length); change one of them")


def _validate_parallel_block(spec: ModelSpec) -> None:
    """A parallel block pairs one attention with one dense MLP: no experts, latent attention or Mamba layers."""
    if spec.parallel_block == "off":
        return
    odd = sorted({c for c in spec.layer_pattern if c not in "GL"})
    clash = ("experts" if spec.experts else "attention_type=mla" if spec.attention_type == "mla"
             else f"layer_pattern characters {''.join(odd)}" if odd else "")
    if clash:
        raise ConfigError(f"model: parallel_block={spec.parallel_block} pairs one attention with one dense MLP per "
                          f"layer and cannot be combined with {clash}; set parallel_block=off")
