"""FrameworkProfile: the software stack a plan runs on, as data.

Why a profile and not plan fields: a published run names its stack
(Megatron-LM of 2021, Megatron-Core/NeMo, Megatron-DeepSpeed, torchtitan), and
the stack decides every execution default that is not a parallelism choice —
which attention kernel runs, whether dropout runs, whether sequence
parallelism comes with tensor parallelism, whether communication overlaps
compute, how the optimizer is sharded. Naming the stack lets a user's plan
and a validation row be written the same way; plan knobs (``sp``,
``tp_overlap``, ``dp_overlap``, ``zero``) still override it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from stageopt.errors import ConfigError

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zbh1", "zb2p", "zbv", "dualpipe", "dualpipev")
BUCKETS = ("layer", "chunk", "stage")
# Training data types whose linear-layer GEMMs run in low precision (everything else stays BF16).
LOW_PRECISION_RECIPES = ("fp8", "nvfp4")
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8")  # how FP8 casts are scaled (Megatron-Core's --fp8-recipe)
# Groups of elementwise ops a stack launches as one kernel (tags in stageopt.graph.templates);
# "all" is a compiler (torch.compile) fusing every run of adjacent elementwise/norm ops.
FUSION_GROUPS = ("bias_dropout_add", "bias_activation", "rope", "cross_entropy", "norm", "all", "qkv", "fc1",
                 "squared_relu", "activation_clamp", "expert_fc1")
# "activation_clamp": the experts' input clamp (gpt-oss's swiglu_limit) runs inside their compiled activation
# kernel rather than as eager clamps before it.
# hp_grad.add_(lp_grad.to(fp32)): read the bf16 gradient (2), write its fp32 copy (4), read the copy and the
# fp32 buffer (4 + 4), write the buffer (4). Zeroing the bf16 gradients first is left out (version-dependent).
GRAD_CAST_ADD_BYTES = 18
# "qkv" and "fc1" fuse GEMMs rather than elementwise ops: the query/key/value projections, and the
# gate and up projections of a gated MLP, run as one GEMM each (its output columns concatenated); "fc1" fuses the
# routed experts' too, "expert_fc1" only theirs (a stack whose experts hold one gate-and-up weight, dense MLPs two).

# The oldest NCCL release whose ring cost model stageopt holds (stageopt.hardware.nccl_protocols.NCCL_RELEASES).
OLDEST_NCCL_RELEASE = (2, 8)


def nccl_version(release: str) -> tuple[int, ...]:
    """An NCCL release (``"2.10"``, ``"2.18.3"``) as a version tuple, or a one-line error."""
    try:
        version = tuple(int(part) for part in str(release).split("."))
    except ValueError:
        raise ConfigError(f"nccl release {release!r} is not a version; write it as major.minor (for example "
                          f"\"2.18\")") from None
    if version < OLDEST_NCCL_RELEASE:
        oldest = ".".join(map(str, OLDEST_NCCL_RELEASE))
        raise ConfigError(f"nccl release {release!r} predates the cost models stageopt knows; give {oldest} or later")
    return version


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkProfile:
    """Execution defaults of one training stack (see ``simulators/frameworks/*.yaml``).

    ``attention`` and ``dropout`` set to ``None`` defer to the model file
    (its ``attention`` and ``dropout`` fields). ``distributed_optimizer`` makes
    ZeRO-1 (optimizer states sharded over data parallelism) the default when
    dp > 1; ``fsdp`` makes ZeRO-3 (parameters too) the default. ``dp_bucket``
    is the granularity of gradient synchronisation in traces and replay.
    ``attention_kernel`` is the fused attention implementation: ``best`` (today's cuDNN
    fused attention / FlashAttention-3 class, the GPU's ``attention_*`` figures), ``cudnn-2024`` (the cuDNN that 2024's
    containers shipped, :data:`stageopt.hardware.efficiency.CUDNN_2024_SHARE` of the best rate)
    or ``fa2`` (FlashAttention-2, as PyTorch SDPA's flash backend ships; the
    GPU's ``attention_*.fa2_peak_fraction``, measured, or ``fa2_attention_scale``
    of the best share where it is not) or ``flex`` (PyTorch's FlexAttention, its measured share of the best
    kernel: :data:`stageopt.hardware.efficiency.FLEX_SHARE`). ``attention_unpad``: the stack calls
    FlashAttention's variable-length kernel through its padding helpers (flash_attn.bert_padding: a gather
    of the query, key and value rows before, a zero-filled scatter of the output after, and their transposes
    in backward), as llm-foundry's attn_impl flash does. ``fusions`` lists the elementwise fusion
    groups the stack launches as one kernel (:data:`FUSION_GROUPS`). ``pipeline_scatter_gather`` sends only a
    1/tp shard of each pipeline activation when sequence parallelism is off,
    re-gathered over NVLink on arrival (Megatron-LM since 2021).
    ``grad_bucket_params`` caps the parameters per gradient-sync collective
    (each bucket pays the collective's latency), raised to
    ``grad_bucket_params_per_rank`` x the data-parallel size where that is larger
    (Megatron-Core sizes buckets so); ``zero3_bucket_params`` does the
    same for ZeRO-3 parameter gathers and gradient scatters (None: one per block,
    as FSDP wraps each transformer block); ``zero3_prefetch`` gathers the next
    block's parameters on a side stream while the current one computes.
    ``fsdp_unsharded_across_microbatches``: with pipeline parallelism the stack
    gathers FSDP parameters once per step and keeps them (and unreduced
    gradients) until the last micro-batch's backward, as PyTorch's pipelining
    stages do for FSDP2 modules; ZeRO-3 then costs what ZeRO-1 does.
    ``selective_recompute`` is what the stack's selective checkpointing keeps:
    ``attention`` (Megatron: only the attention core is re-run, a fused flash
    kernel included) or ``op`` (torchtitan's op-level policy: matmul outputs
    are saved except every second one, attention and reduce-scatters are
    saved, everything else is re-run).
    ``grad_reduce_dtype`` is the dtype bf16 (and fp8) training accumulates and
    reduces gradients in, where the plan leaves ``grad_dtype`` unset (fp16
    training reduces fp16 gradients in every shipped stack).
    ``bf16_grad_all_reduce``: bf16/fp8 training all-reduces whole gradients
    even when the optimizer is sharded (ZeRO-1/2), each rank then updating its
    shard, as DeepSpeed's BF16_Optimizer does; otherwise they are
    reduce-scattered.
    ``moe_dispatcher`` is the stack's default MoE token dispatch (a plan's
    ``dispatcher`` overrides it): ``alltoall`` or ``flex`` (node-deduplicated,
    DeepEP / HybridEP). ``cp_comm`` is its default context-parallel K/V exchange
    (Megatron-LM's ``--cp-comm-type`` defaults to ``p2p``; a plan's ``cp_comm`` overrides it).
    ``expert_gemms`` is how a rank's routed experts run their GEMMs: ``grouped`` (one grouped
    kernel: CUTLASS grouped GEMM, ``torch._grouped_mm``) or ``per_expert`` (one cuBLAS GEMM per
    local expert, spread over a few compute streams: Transformer Engine's ``GroupedLinear``).
    ``expert_bias`` is how it adds routed experts' biases (gpt-oss): ``megatron`` (the first inside the fused
    bias-activation kernel, the second scaled by the router probabilities in fp32, eagerly: Megatron-Core) or
    ``eager`` (both added per local expert in bf16 and concatenated: NeMo AutoModel's DeepEP experts).
    ``cross_entropy`` is how the loss holds memory (bytes a logit kept from
    forward to backward, and at the loss's peak): ``te_fused`` (Transformer
    Engine's fused cross-entropy, as Megatron-Bridge sets it: the gradient is
    written into the bf16 logits in place; 2 and 2), ``flash_attn`` (flash-attn's
    fused ``CrossEntropyLoss``, llm-foundry's default: it keeps the bf16 logits and
    returns a new bf16 gradient; 2 and 4), ``in_place`` (Megatron's
    vocab-parallel cross-entropy on an fp32 copy of the logits, softmax turned
    into the gradient in place; 4 and 6, the bf16 logits beside the fp32),
    ``native_fused`` (Megatron-Core's fused vocab-parallel loss before Transformer
    Engine's, NeMo's default from September 2024 to mid-2025: the same fp32 softmax
    in three compiled kernels; 4 and 6) or
    ``pytorch`` (``F.cross_entropy(logits.float())``, torchtitan: its backward
    holds the saved log-softmax, the gradient it receives and the one it
    returns, all fp32; 4 and 12).
    ``fp8_saves_inputs``: in FP8 (or NVFP4) training each low-precision GEMM
    keeps only the quantized copy of its input for the weight gradient
    (Transformer Engine); otherwise it keeps the high-precision input and casts
    it again in backward (torchao's Float8Linear), so FP8 saves what bf16 saves.
    ``fp8_params``: in FP8 (or NVFP4) training the weights are held in
    the low precision and ZeRO/FSDP gathers them so (Megatron's ``--fp8-param-gather`` /
    ``--fp4-param-gather``, which NeMo 2's and Megatron-Bridge's FP8 recipes set; torchao's
    FSDP float8 all-gather); otherwise they stay BF16, gathered in BF16 and cast per GEMM
    (Megatron-LM's default, NeMo 1's, Apex's distributed Adam).
    ``low_precision``: the low-precision GEMM recipes the stack ships (``fp8``;
    ``nvfp4``: Transformer Engine's NVFP4 block scaling, Blackwell only).
    ``fp8_recipe``: how FP8 training scales its casts where the plan does not say (Megatron-Core's
    ``--fp8-recipe``, whose default is ``delayed``): ``delayed`` (amax history), ``tensorwise``
    (current scaling: Megatron-Bridge's FP8-CS, torchao's dynamic Float8) or ``mxfp8`` (Blackwell
    block scaling); :data:`stageopt.hardware.kernels.FP8_CASTS` prices each.
    ``tp_async_backward``: without userbuffer overlap, a linear layer's backward
    still issues two TP collectives asynchronously, each beside a GEMM of the
    same layer: the re-gather of its sequence-parallel input beside the
    data-gradient GEMM, the reduce-scatter (or all-reduce) of its input gradient
    beside the weight-gradient GEMM (Transformer Engine's ``Linear``; Megatron-Core's
    ``LinearWithGradAccumulationAndAsyncCommunication``).
    ``sp_saves_shard``: with sequence parallelism a tensor-parallel all-gather's
    output that backward reads is saved as its 1/tp shard and gathered again in
    backward (Megatron-LM's sequence parallelism); otherwise it is saved whole and
    not gathered again (DTensor's redistribution in torchtitan).
    ``grad_cast_add``: bf16 training (ZeRO 0-1) lets each micro-batch's backward write bf16 gradients
    on the parameters and then adds them, cast to fp32, into the fp32 gradient buffer (DeepSpeed's
    BF16_Optimizer: its pipeline engine calls ``update_hp_grads`` after every backward pass):
    :data:`GRAD_CAST_ADD_BYTES` of HBM traffic per parameter and micro-batch. Megatron's
    gradient-accumulation fusion has the weight-gradient GEMM write the fp32 buffer instead.
    ``fsdp_copies``: the copies PyTorch FSDP makes of each unit's parameters and gradients on every
    micro-batch besides its collectives (``none`` for other stacks), priced as one memory-bound kernel after
    the unit's backward (outside pipelines only the step's total counts; FSDP runs part of them on side
    streams beside compute, so this is the upper end of their cost):

    - ``fsdp1`` (``FullyShardedDataParallel``; ``torch/distributed/fsdp/_runtime_utils.py``): the
      post-backward hook casts the unsharded bf16 gradient to the reduce dtype when the two differ (read 2,
      write the reduce dtype) and divides it in place by the pre-divide factor, a power of two above 1 from
      two ranks up (read and write the reduce dtype): 14 bytes a parameter with an fp32 reduce, 4 with bf16;
    - ``fsdp2`` (``fully_shard``; ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): every
      all-gather's output is copied out of the rank-interleaved buffer into each parameter
      (``foreach_all_gather_copy_out``: read and write 2 bytes; two gathers a micro-batch under ZeRO-3,
      forward and backward, one under ZeRO-2), and the gradients are copied into the reduce-scatter input
      in the reduce dtype (``foreach_reduce_scatter_copy_in``: read 2, write the reduce dtype; NCCL's
      average divides): 14 bytes with an fp32 reduce under ZeRO-3.
    ``wgrad_accumulation_fusion``: each weight-gradient GEMM adds its result into the main-gradient
    buffer in its epilogue (Megatron-LM since February 2022, commit 83b1e42f; Transformer Engine's
    ``fuse_wgrad_accumulation``), so its output store reads and writes the buffer's dtype
    (``grad_dtype``) on every micro-batch instead of writing one BF16 copy. Not under ZeRO-3: Megatron-FSDP
    runs without it (Megatron-Bridge's FSDP recipes set ``gradient_accumulation_fusion = False``).
    ``master_weights``: the optimizer keeps an fp32 master copy of every parameter it updates (Megatron's
    distributed optimizer, FSDP over fp32 parameters); off, it updates the bf16 parameters in place and their
    gradients are held in bf16 after the reduction, as ``torch.optim.Adam`` or Transformer Engine's ``FusedAdam``
    (``master_weights=False``, its default) on a model loaded in bf16 do (NeMo AutoModel's recipes): Adam's
    moments are then all the state a parameter carries (plan ``adam_moments``).
    ``optimizer_post_validation``: the stack replaces the optimizer step's global synchronisation (the gradient
    norm for clipping, the inf/NaN check) with a check after the update (Qi et al. 2024, sec. 4; the zero-bubble
    fork's ``--enable-optimizer-post-validation``), so each pipeline stage starts the next iteration as soon as it
    has finished this one. The analytical model prices ZB-2p's steady state then, the parallelogram the bypass
    was made for: the second of two iterations run back to back, less the first
    (:func:`stageopt.sim.analytical_schedules.schedule_shape_results`).
    ``async_p2p_schedules``: schedules the stack runs on a runtime that batches each pipeline send with the
    receives posted after it and waits on the whole batch only before the pass that consumes them (the
    zero-bubble fork's ``zb_schedules.py``): a send followed by a W pass, which receives nothing, goes alone and
    overlaps the W, delaying only its consumer; every other send blocks, as in Megatron's ``schedules.py``.
    ``nccl_release``: the NCCL release the stack shipped with (``"2.10"``; None: the hardware's
    ``nccl.release``, today's cost model). NCCL chooses each ring's protocol by its own cost model, whose
    constants changed between releases (:data:`stageopt.hardware.nccl_protocols.NCCL_RELEASES`).
    """

    name: str
    description: str = ""
    source: str = ""
    attention: Literal["flash", "eager"] | None = None
    dropout: bool | None = None
    sequence_parallel: bool = True
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = True
    distributed_optimizer: bool = True
    fsdp: bool = False
    dp_bucket: Literal["layer", "chunk", "stage"] = "layer"
    schedules: tuple[str, ...] = SCHEDULE_NAMES
    fusions: tuple[str, ...] = ()
    attention_kernel: Literal["best", "cudnn-2024", "fa2", "flex"] = "best"
    attention_unpad: bool = False
    pipeline_scatter_gather: bool = False
    grad_bucket_params: float | None = 4e7
    grad_bucket_params_per_rank: float = 0.0
    zero3_bucket_params: float | None = None
    zero3_prefetch: bool = True
    moe_shared_expert_overlap: bool = False
    fsdp_unsharded_across_microbatches: bool = False
    selective_recompute: Literal["attention", "op"] = "attention"
    grad_reduce_dtype: Literal["bf16", "fp32"] = "bf16"
    bf16_grad_all_reduce: bool = False
    moe_dispatcher: Literal["alltoall", "flex"] = "alltoall"
    expert_gemms: Literal["grouped", "per_expert"] = "grouped"
    expert_bias: Literal["megatron", "eager"] = "megatron"
    cp_comm: Literal["all_gather", "p2p", "a2a", "a2a+p2p"] = "all_gather"
    cross_entropy: Literal["te_fused", "flash_attn", "in_place", "native_fused", "pytorch"] = "in_place"
    fp8_saves_inputs: bool = False
    fp8_params: bool = True
    low_precision: tuple[str, ...] = ("fp8",)
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8"] = "delayed"
    tp_async_backward: bool = False
    sp_saves_shard: bool = True
    grad_cast_add: bool = False
    fsdp_copies: Literal["none", "fsdp1", "fsdp2"] = "none"
    wgrad_accumulation_fusion: bool = False
    optimizer_post_validation: bool = False
    master_weights: bool = True
    async_p2p_schedules: tuple[str, ...] = ()
    nccl_release: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("framework profile: name is empty; give the profile a name")
        bad = [f for f in self.fusions if f not in FUSION_GROUPS]
        if bad:
            raise ConfigError(f"framework {self.name}: fusions {bad} unknown; choose from {', '.join(FUSION_GROUPS)}")
        if any(d not in LOW_PRECISION_RECIPES for d in self.low_precision):
            raise ConfigError(f"framework {self.name}: low_precision {list(self.low_precision)} must list "
                              f"some of {', '.join(LOW_PRECISION_RECIPES)}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"framework {self.name}: fp8_recipe {self.fp8_recipe!r} unknown; choose from "
                              f"{', '.join(FP8_RECIPES)}")
        if self.nccl_release is not None:
            nccl_version(self.nccl_release)
        unknown = [s for s in self.async_p2p_schedules if s not in SCHEDULE_NAMES]
        if unknown:
            raise ConfigError(f"framework {self.name}: async_p2p_schedules {unknown} unknown; choose from "
                              f"{', '.join(SCHEDULE_NAMES)}")
        unknown = [s for s in self.schedules if s not in SCHEDULE_NAMES]
        if unknown or not self.schedules:
            raise ConfigError(f"framework {self.name}: schedules {list(self.schedules)} must be a non-empty "
                              f"list of {', '.join(SCHEDULE_NAMES)}")

    def grad_bucket(self, dp_ranks):
        """Parameters per gradient bucket for a data-parallel group of ``dp_ranks`` (None: one bucket)."""
        if self.grad_bucket_params is None:
            return None
        return np.maximum(self.grad_bucket_params, self.grad_bucket_params_per_rank * np.asarray(dp_ranks, dtype=float))

    def default_grad_dtype(self, dtype: str) -> str:
        """The gradient dtype this stack uses for a plan computing in ``dtype``."""
        return self.grad_reduce_dtype if dtype in ("bf16", *LOW_PRECISION_RECIPES) else "bf16"

    def grad_staging_bytes(self, dtype: str, grad_bytes: float, zero: int) -> float:
        """HBM bytes per parameter and micro-batch the stack's data parallelism copies besides its collectives
        (0: none): DeepSpeed's bf16-to-fp32 staging (``grad_cast_add``) or FSDP's copies (``fsdp_copies``).
        ``grad_bytes``: bytes an element of the gradient's reduce dtype."""
        if self.grad_cast_add and dtype == "bf16" and grad_bytes == 4 and zero <= 1:
            return GRAD_CAST_ADD_BYTES
        if self.fsdp_copies == "none" or zero < 2:
            return 0
        computed = 4 if dtype == "fp32" else 2  # FSDP's param_dtype: the gradient autograd writes
        if self.fsdp_copies == "fsdp1":
            return (computed + grad_bytes if grad_bytes != computed else 0) + 2 * grad_bytes
        gathers = 2 if zero >= 3 else 1
        return gathers * 2 * computed + computed + grad_bytes

    def wgrad_store_bytes(self, grad_bytes: int, zero: int) -> int | None:
        """Bytes an element of a weight-gradient GEMM's output moves in its epilogue: the accumulate
        reads and writes the ``grad_bytes``-wide main gradient (None: the GEMM writes a BF16 copy)."""
        return 2 * grad_bytes if self.wgrad_accumulation_fusion and zero < 3 else None

    def all_reduces_sharded_grads(self, dtype: str) -> bool:
        """Whether ZeRO-1/2 gradients are all-reduced whole (not reduce-scattered) for ``dtype`` training."""
        return self.bf16_grad_all_reduce and dtype in ("bf16", *LOW_PRECISION_RECIPES)

    def default_zero(self, dp: int, cp: int = 1) -> int:
        """The ZeRO stage this stack uses when the plan does not say (states shard over dp x cp)."""
        if dp * cp <= 1:
            return 0
        return 3 if self.fsdp else (1 if self.distributed_optimizer else 0)
