"""Plan: how one training iteration is split across GPUs.

``Plan.parse("tp=8 pp=4 dp=32 mbs=1 gbs=1536 zero=1 recompute=full sp=on")``
reads the string form users type. ``validate_plan`` checks a plan against a
model and a GPU count and raises :class:`InfeasiblePlan` naming the rule, the
values and a fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.frameworks import FrameworkProfile, load_profile
from stageopt.frameworks.profile import FP8_RECIPES, LOW_PRECISION_RECIPES, SCHEDULE_NAMES
from stageopt.inputs.gate import shorten
from stageopt.inputs.limits import MAX_GPUS, PLAN_BOUNDS, check_count, check_gpus
from stageopt.parallel.plan_checks import (CP_COMMS, V_SCHEDULES, check_context_fields,  # noqa: F401 (re-exported)
                                           check_dispatcher, check_ep_overlap, check_expert_tp, check_offload,
                                           check_pipeline_fields, check_recompute_layers, check_recompute_modules,
                                           check_sharding)
from stageopt.parallel.plan_text import parse_fields, plan_text

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = SCHEDULE_NAMES  # one list: a profile names the ones its stack runs
# Bytes a parameter of each training dtype is gathered and held in: low-precision recipes gather FP8 / NVFP4
# weights (Megatron's fp8_param_gather / fp4_param_gather); NVFP4 is 4.5 bits an element with its block scales.
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "nvfp4": 0.5625}
GRAD_DTYPES = ("bf16", "fp16", "fp32", "fp8")


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """Degrees of every parallel axis plus batch, memory and schedule choices, on one software stack.

    ``framework`` is the stack the plan runs on (:class:`FrameworkProfile`,
    default ``megatron-core``). ``sp``, ``zero``, ``dp_overlap`` and
    ``tp_overlap`` left as ``None`` take the stack's default; a value given
    here overrides it. ``dp_overlap`` overlaps gradient reduction with
    backward; ``tp_overlap`` pipelines TP collectives with the GEMMs next to
    them (Megatron-Core's userbuffer overlap). ``dp`` counts data-parallel
    replicas; ``ep`` experts are split across the ranks right after expert TP in a stage's
    tp x cp x dp ranks (Megatron-Core's expert layout: CP ranks, then DP; see
    :mod:`stageopt.parallel.ranks`). ``vpp`` is the number of virtual pipeline
    chunks per stage (interleaved 1F1B; V-shaped schedules have 2); the interleaved schedule runs ``vpp_group``
    micro-batches through a chunk before the next (``--microbatch-group-size-per-virtual-pipeline-stage``; 0 = pp).
    ``flushes`` splits the step's micro-batches over that many back-to-back runs of the schedule, each draining
    the pipeline and syncing gradients, one optimizer step after the last: gradient accumulation as
    torch.distributed.pipelining runs it (torchtitan, NeMo AutoModel: one schedule step per local batch).

    Uneven pipelines as Megatron-Core builds them: ``first_layers`` /
    ``last_layers`` (``--decoder-first/last-pipeline-num-layers``; 0 = unset),
    ``embed_split`` / ``loss_split`` (``--account-for-embedding/loss-in-
    pipeline-split``) or a ``layout`` string
    (``--pipeline-model-parallel-layout``); see
    :mod:`stageopt.parallel.pipeline_split`.

    Context parallelism (Megatron-Core's ``--cp-comm-type``): ``cp_comm``
    ``all_gather`` gathers K and V before attention; ``p2p`` passes K/V blocks
    around a ring, each step overlapped with the attention of the previous
    block; ``a2a`` (Ulysses) trades the sequence split for a head split with
    all-to-alls before and after attention; unset, the stack's default (``p2p`` on
    Megatron-Core, ``all_gather`` on torchtitan). Causal attention is load-balanced
    over CP ranks as Megatron-Core and Transformer Engine do it: the sequence
    is cut into 2*cp chunks, rank i holding chunks i and 2cp-1-i, so every rank
    does the same share (hence seq must divide by 2*cp). ``a2a+p2p`` is the
    hierarchical mix (``--hierarchical-context-parallel-sizes``): Ulysses
    all-to-alls inside groups of ``cp_a2a`` ranks, then a K/V ring over the
    ``cp / cp_a2a`` groups.

    Hybrid sharding (HSDP; torchtitan's ``data_parallel_shard_degree``,
    Megatron-Core's ``--num-distributed-optimizer-instances``): ``dp_shard``
    data-parallel ranks (with their CP ranks) share one copy of the ZeRO-sharded
    states, and the ``dp / dp_shard`` copies are replicas whose gradients are
    all-reduced after the reduce-scatter inside each copy. 0 (or ``dp``) shards
    over all of dp.

    ``recompute_modules`` (with ``recompute=selective``; Megatron-Core's
    ``--recompute-modules``) names the parts of each layer that are re-run
    instead of stored, joined by ``+``: ``core_attn``, ``mla_up_proj``,
    ``layernorm``, ``mlp`` (dense MLPs), ``moe``, ``moe_act``, ``shared_experts``.
    Empty: the stack's own selective policy.

    ``offload_layers`` (Megatron-Core's ``--cpu-offloading-num-layers``): the saved activations of the first that
    many decoder layers are copied to host memory during forward and back before their backward, each copy
    overlapped with the next layer's compute (Transformer Engine's offload handler); Megatron-Core allows it only
    without pipeline parallelism and recompute; the host link is the hardware's ``gpu.host_link_gbps``.

    ``recompute_layers`` (with ``recompute=full``; Megatron-Core's ``--recompute-method block
    --recompute-num-layers N``) re-runs only the first N decoder layers of each model chunk (each
    virtual stage under interleaving) and stores the others' activations whole; 0: every layer.

    ``adam_moments=bf16`` keeps Adam's two moments in bf16 (Megatron-Core's precision-aware optimizer,
    ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``): 8 bytes of optimizer state per parameter instead of 12.

    MoE token dispatch (Megatron-Core's ``--moe-token-dispatcher-type``): ``alltoall`` sends every routed copy of
    a token to its expert's rank; ``flex`` (DeepEP / HybridEP) sends it once to each node and rank holding its experts.

    ``ep_overlap`` (Megatron-Core's ``--overlap-moe-expert-parallel-comm``, Megatron-Bridge's
    ``moe_a2a_overlap``) merges each steady-state forward with the backward after it (combined
    1F1B): one micro-batch's dispatch and combine all-to-alls run under the other's compute. It
    needs no full recompute, no ``moe_overlap``, and with pp > 1 the interleaved schedule; with ep = 1 it is off.

    ``cuda_graphs`` replays the whole step from CUDA graphs (``--cuda-graph-impl full_iteration``): each kernel
    pays ``graph_launch_us`` and no host dispatch time; graphs over parts of layers are not modelled.

    ``fp8_recipe`` (``--fp8-recipe``; None: the stack's): ``delayed``, ``tensorwise`` or ``mxfp8`` (kernels.FP8_CASTS).
    ``bucket_mb`` (Apex's ``bucket_cap_mb``; 0: the stack's) caps each data-parallel bucket at that many MiB.
    ``fp8_params`` (Megatron's ``--fp8-param-gather`` / ``--fp4-param-gather``; None: the stack's): with ``dtype=fp8``
    or ``nvfp4`` the weights are held and gathered in that precision; off, they stay BF16 (:attr:`weight_bytes`).

    Expert tensor parallelism (Megatron-Core's ``--expert-tensor-parallel-size``):
    ``etp`` 0 (or ``tp``) splits every routed expert over the TP group as the dense
    MLP is; ``etp=1`` keeps experts whole on every TP rank, which routes its own
    sequence-parallel tokens through them (no TP collectives around the experts;
    expert gradients reduce over tp x expert-data-parallel ranks).
    """

    dp: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int = 1
    vpp_group: int = 0
    flushes: int = 1
    sp: bool | None = None
    mbs: int = 1
    gbs: int = 1
    zero: int | None = None
    recompute: str = "none"
    schedule: str = "1f1b"
    dtype: str = "bf16"
    grad_dtype: str | None = None
    fp8_recipe: str | None = None
    fp8_params: bool | None = None
    bucket_mb: int = 0
    dp_overlap: bool | None = None
    tp_overlap: bool | None = None
    first_layers: int = 0
    last_layers: int = 0
    embed_split: bool = False
    loss_split: bool = False
    layout: str = ""
    cp_comm: str | None = None
    moe_overlap: bool | None = None
    ep_overlap: bool = False
    cuda_graphs: bool = False
    dp_shard: int = 0
    etp: int = 0
    cp_a2a: int = 0
    dispatcher: str | None = None
    recompute_modules: str = ""
    adam_moments: str = "fp32"
    offload_layers: int = 0
    recompute_layers: int = 0
    framework: FrameworkProfile = field(default_factory=load_profile)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "cp", "pp", "ep", "vpp", "mbs", "gbs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InfeasiblePlan(f"plan field '{name}' must be a positive integer, got {shorten(value)}")
            _within_bound(name, value)
        if self.gpus > MAX_GPUS:
            raise InfeasiblePlan(f"plan: dp*tp*cp*pp = {self.gpus:.3g} GPUs is above the bound {MAX_GPUS:.0e} "
                                 "(the largest clusters have ~10^6 GPUs); check the degrees for a typo")
        self._fill_from_framework()
        if self.zero not in (0, 1, 2, 3):
            raise InfeasiblePlan(f"plan field 'zero' must be 0, 1, 2 or 3, got {shorten(self.zero)}")
        if self.recompute not in RECOMPUTE:
            raise InfeasiblePlan(f"plan field 'recompute' must be one of {', '.join(RECOMPUTE)}, "
                                 f"got {shorten(self.recompute)}")
        if self.schedule not in SCHEDULES:
            raise InfeasiblePlan(f"plan field 'schedule' must be one of {', '.join(SCHEDULES)}, "
                                 f"got {shorten(self.schedule)}")
        if not isinstance(self.bucket_mb, int) or isinstance(self.bucket_mb, bool) or self.bucket_mb < 0:
            raise InfeasiblePlan(f"plan field 'bucket_mb' must be a whole number of MiB >= 0 (0: the stack's "
                                 f"buckets), got {shorten(self.bucket_mb)}")
        if self.adam_moments not in ("fp32", "bf16"):
            raise InfeasiblePlan(f"plan field 'adam_moments' must be fp32 or bf16, got {shorten(self.adam_moments)}")
        for name, allowed in (("dtype", tuple(DTYPES)), ("grad_dtype", GRAD_DTYPES), ("fp8_recipe", FP8_RECIPES)):
            if getattr(self, name) not in allowed:
                raise InfeasiblePlan(f"plan field '{name}' must be one of {', '.join(allowed)}, "
                                     f"got {shorten(getattr(self, name))}")
        check_pipeline_fields(self)
        check_context_fields(self)
        check_sharding(self)
        check_expert_tp(self)
        check_dispatcher(self)
        check_recompute_modules(self)
        check_offload(self)
        check_recompute_layers(self)
        check_ep_overlap(self)
        if self.dtype != "fp8":  # the scaling recipe is an FP8 choice: other dtypes keep the stack's
            object.__setattr__(self, "fp8_recipe", self.framework.fp8_recipe)
        if self.sp and self.tp == 1:
            object.__setattr__(self, "sp", False)  # sequence parallelism is a no-op without TP

    @property
    def recomputed_per_chunk(self) -> int | None:
        """Layers of each model chunk that full recompute re-runs (None: all of them)."""
        return self.recompute_layers if self.recompute == "full" and self.recompute_layers else None

    @property
    def cpa(self) -> int:
        """Context-parallel ranks of one all-to-all group (hierarchical CP), 1 otherwise."""
        return self.cp_a2a or 1

    @property
    def expert_tp(self) -> int:
        """TP ranks each routed expert is split over (tp unless etp=1)."""
        return self.etp or self.tp

    def stack_defaults(self) -> dict[str, object]:
        """What the stack sets for the knobs a plan may leave as None."""
        stack = self.framework
        return {"sp": stack.sequence_parallel and self.tp > 1, "dp_overlap": stack.dp_comm_overlap,
                "tp_overlap": stack.tp_comm_overlap and self.tp > 1, "zero": stack.default_zero(self.dp, self.cp),
                "moe_overlap": stack.moe_shared_expert_overlap,
                "grad_dtype": stack.default_grad_dtype(self.dtype), "dispatcher": stack.moe_dispatcher,
                "fp8_recipe": stack.fp8_recipe, "fp8_params": stack.fp8_params,
                "cp_comm": stack.cp_comm if self.cp > 1 else "all_gather"}  # no K/V to exchange without CP

    def _fill_from_framework(self) -> None:
        """Knobs the plan leaves as None take the stack's default."""
        if not isinstance(self.framework, FrameworkProfile):
            raise InfeasiblePlan(f"plan field 'framework' must be a FrameworkProfile, got {self.framework!r}")
        for name, value in self.stack_defaults().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    @property
    def microbatch_group(self) -> int:
        """Micro-batches the interleaved schedule runs through a chunk in a row (Megatron-Core's default: pp)."""
        return self.vpp_group or self.pp

    @property
    def microbatches(self) -> int:
        """Micro-batches each pipeline runs per flush (per iteration unless ``flushes`` > 1)."""
        return self.gbs // (self.mbs * self.dp * self.flushes)

    @property
    def p2p_scatter_gather(self) -> bool:
        """Pipeline messages carry a 1/tp shard (SP off, tp > 1, the stack scatters and re-gathers)."""
        return self.framework.pipeline_scatter_gather and not self.sp and self.tp > 1

    @property
    def step_zero(self) -> int:
        """The ZeRO stage whose communication and memory the step follows.

        ZeRO-3 under pipeline parallelism on a stack that keeps FSDP parameters
        gathered across micro-batches (torchtitan) gathers and reduces once per
        step and holds whole parameters and gradients meanwhile: ZeRO-1's costs.
        """
        if self.zero == 3 and self.pp > 1 and self.framework.fsdp_unsharded_across_microbatches:
            return 1
        return self.zero

    @property
    def fsdp_step_sync(self) -> bool:
        """The step's sync is FSDP's, one collective per wrapped module (``zero3_bucket_params``; None: per
        block), not the DDP path's gradient buckets: ZeRO-3 held unsharded across micro-batches (:attr:`step_zero`
        1), and ZeRO-1/2 on an FSDP stack (SHARD_GRAD_OP reduce-scatters and gathers per module as FULL_SHARD)."""
        return (self.zero == 3 and self.step_zero < 3) or (self.framework.fsdp and self.zero in (1, 2))

    @property
    def dp_sync_bucket_params(self):
        """Parameters per collective of the step's data-parallel sync (None: one per block), see
        :attr:`fsdp_step_sync`."""
        if self.fsdp_step_sync:
            return self.framework.zero3_bucket_params
        return self.grad_bucket_params(self.dp * self.cp)

    def grad_bucket_params(self, dp_ranks):
        """Parameters per gradient bucket over ``dp_ranks`` data-parallel ranks (``bucket_mb``, else the stack's)."""
        return self.fixed_bucket_params or self.framework.grad_bucket(dp_ranks)

    @property
    def fixed_bucket_params(self) -> int:  # parameters in a ``bucket_mb`` bucket of gradients (0: the stack's)
        return self.bucket_mb * 2**20 // self.grad_bytes

    @property
    def grad_staging_bytes(self) -> float:
        """HBM bytes per parameter and micro-batch the stack spends on gradients before reducing them
        (:meth:`~stageopt.frameworks.profile.FrameworkProfile.grad_staging_bytes`)."""
        return self.framework.grad_staging_bytes(self.dtype, self.grad_bytes, self.step_zero)

    @property
    def wgrad_store_bytes(self) -> int | None:
        """Bytes per element a weight-gradient GEMM's epilogue moves (None: one BF16 write)."""
        return self.framework.wgrad_store_bytes(self.grad_bytes, self.zero)

    @property
    def grad_sync_kind(self) -> str:
        """The collective that reduces gradients over data parallelism at the end of a step (ZeRO 0-2)."""
        whole = self.step_zero == 0 or self.framework.all_reduces_sharded_grads(self.dtype)
        return "all_reduce" if whole else "reduce_scatter"

    @property
    def shard_dp(self) -> int:
        """Data-parallel ranks that share one sharded copy of the ZeRO states (dp unless hybrid)."""
        return self.dp_shard or self.dp

    @property
    def dp_replicate(self) -> int:
        """Copies of the sharded states (1 unless hybrid sharding)."""
        return self.dp // self.shard_dp

    @property
    def expert_dp_ranks(self) -> int:
        """Ranks that hold the same experts (their gradient and ZeRO group): a stage's tp x cp x dp ranks
        over etp x ep, as Megatron-Core factors them (stageopt.parallel.ranks)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def dtype_bytes(self) -> float:
        return DTYPES[self.dtype]

    @property
    def weight_bytes(self) -> float:
        """Bytes a weight is held and gathered in: the low-precision dtype where the stack keeps its weights so
        (``fp8_params``), else BF16."""
        if self.dtype in LOW_PRECISION_RECIPES and not self.fp8_params:
            return DTYPES["bf16"]
        return DTYPES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPES[self.grad_dtype]

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer state per parameter: the fp32 master weight (unless the stack has none) and Adam's moments."""
        return 4 * self.framework.master_weights + 2 * DTYPES[self.adam_moments]

    @property
    def grad_held_bytes(self) -> float:
        """Bytes a parameter's gradient is held in: the reduction dtype, or bf16 without master weights."""
        return self.grad_bytes if self.framework.master_weights else DTYPES["bf16"]

    def replace(self, **changes: object) -> "Plan":
        return dataclasses.replace(self, **changes)

    @property
    def pipeline_split(self) -> dict[str, object]:
        """The uneven-pipeline fields, as keyword arguments of ``split_layers``."""
        return {"first": self.first_layers, "last": self.last_layers, "embed_split": self.embed_split,
                "loss_split": self.loss_split, "layout": self.layout}

    __str__ = plan_text

    @classmethod
    def parse(cls, text: str, gpus: int | None = None, framework: FrameworkProfile | None = None) -> "Plan":
        """Parse ``"tp=8 pp=4 ..."``; ``dp`` defaults to gpus / (tp*cp*pp) when ``gpus`` is given.

        The stack is ``framework`` (the CLI's ``--framework``), else a
        ``framework=NAME`` item of the text, else the default profile.
        """
        fields = parse_plan_fields(text)
        named = fields.pop("framework", None)
        if framework is not None and named is not None and named != framework.name:
            raise InfeasiblePlan(f"plan says framework={named} but --framework is {framework.name}; give one")
        fields["framework"] = framework or load_profile(named)
        if gpus is not None:
            check_gpus(gpus)
        for name in ("tp", "cp", "pp"):
            value = fields.get(name, 1)
            if value < 1:
                raise InfeasiblePlan(f"plan field '{name}' must be a positive integer, got {value}")
        if "dp" not in fields:
            if gpus is None:
                fields["dp"] = 1
            else:
                rest = fields.get("tp", 1) * fields.get("cp", 1) * fields.get("pp", 1)
                if gpus % rest:
                    raise InfeasiblePlan(f"plan: tp*cp*pp = {rest} does not divide gpus={gpus}; "
                                         "choose degrees whose product divides the GPU count")
                fields["dp"] = gpus // rest
        if "gbs" not in fields:
            fields["gbs"] = fields.get("mbs", 1) * fields["dp"]
        return cls(**fields)


def _within_bound(name: str, value: int) -> None:
    bound, why = PLAN_BOUNDS[name]
    try:
        check_count(value, f"plan field '{name}'", low=1, high=bound, why=why)
    except ConfigError as err:
        raise InfeasiblePlan(str(err)) from None


def parse_plan_fields(text: str) -> dict[str, object]:
    """The typed fields of a plan string (see :mod:`stageopt.parallel.plan_text`)."""
    return parse_fields(text, [f.name for f in dataclasses.fields(Plan)])
