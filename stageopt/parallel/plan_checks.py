"""The field rules of :class:`stageopt.parallel.plan.Plan` that involve several fields at once.

Why apart: ``Plan`` holds the fields and their derived degrees; these checks (and the
canonical resets they make, e.g. ``cp_comm`` without CP) run once from its
``__post_init__`` and raise :class:`~stageopt.errors.InfeasiblePlan` naming the fix.
"""

from __future__ import annotations

from stageopt.errors import InfeasiblePlan
from stageopt.inputs.gate import shorten

V_SCHEDULES = ("zbv", "dualpipev")  # two chunks per rank in a V: vpp is 2
CP_COMMS = ("all_gather", "p2p", "a2a", "a2a+p2p")  # Megatron-Core's --cp-comm-type
DISPATCHERS = ("alltoall", "flex")  # Megatron-Core's --moe-token-dispatcher-type (flex: DeepEP / HybridEP)
# Megatron-Core's --recompute-modules (selective recompute of named parts of a layer)
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "moe_act", "shared_experts")


def check_sharding(plan) -> None:
    shard = plan.dp_shard
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard <= plan.dp:
        raise InfeasiblePlan(f"plan field 'dp_shard' must be an integer in 0..dp={plan.dp} (0 = all of dp), "
                             f"got {shorten(shard)}")
    if shard in (0, plan.dp):
        object.__setattr__(plan, "dp_shard", 0)
        return
    if plan.dp % shard:
        raise InfeasiblePlan(f"plan: dp_shard={shard} does not divide dp={plan.dp}; the replicas "
                             f"must be whole, so pick dp_shard dividing dp")
    if plan.zero == 0:
        raise InfeasiblePlan(f"plan: dp_shard={shard} shards ZeRO states, but zero=0 shards nothing; "
                             "set zero=1, 2 or 3, or drop dp_shard")
    if plan.ep > 1:
        raise InfeasiblePlan(f"plan: dp_shard={shard} with ep={plan.ep} (hybrid sharding of expert "
                             "states) is not modelled; use ep=1 or drop dp_shard")
    if plan.zero < 3 and plan.framework.all_reduces_sharded_grads(plan.dtype):
        raise InfeasiblePlan(f"plan: dp_shard={shard} needs gradients reduce-scattered inside a copy, but framework "
                             f"{plan.framework.name} all-reduces whole {plan.dtype} gradients; drop dp_shard")


def check_expert_tp(plan) -> None:
    etp = plan.etp
    if not isinstance(etp, int) or isinstance(etp, bool) or etp not in (0, 1, plan.tp):
        raise InfeasiblePlan(f"plan field 'etp' must be 1 or tp={plan.tp} (0 = tp), got {shorten(etp)}; "
                             "other expert-TP splits are not modelled")
    if etp == plan.tp:
        object.__setattr__(plan, "etp", 0)
    elif etp == 1 and not plan.sp:
        raise InfeasiblePlan(f"plan: etp=1 with tp={plan.tp} runs each TP rank's own tokens through whole "
                             "experts, which needs sequence parallelism (Megatron-Core requires it for MoE "
                             "with TP); set sp=on")


def check_context_fields(plan) -> None:
    if plan.cp_comm not in CP_COMMS:
        raise InfeasiblePlan(f"plan field 'cp_comm' must be one of {', '.join(CP_COMMS)}, "
                             f"got {shorten(plan.cp_comm)}")
    if plan.cp == 1:  # nothing to communicate
        object.__setattr__(plan, "cp_comm", "all_gather")
    a2a = plan.cp_a2a
    if not isinstance(a2a, int) or isinstance(a2a, bool) or a2a < 0:
        raise InfeasiblePlan(f"plan field 'cp_a2a' must be a non-negative integer, got {shorten(a2a)}")
    if plan.cp_comm != "a2a+p2p":
        object.__setattr__(plan, "cp_a2a", 0)  # only the hierarchical mix has an all-to-all part
    elif not 1 < a2a < plan.cp or plan.cp % a2a:
        raise InfeasiblePlan(f"plan: cp_comm=a2a+p2p needs cp_a2a, the all-to-all part of cp={plan.cp}: a "
                             f"divisor strictly between 1 and {plan.cp} (got {a2a}); with all of cp use "
                             f"cp_comm=a2a, with none cp_comm=p2p")


def check_pipeline_fields(plan) -> None:
    for name in ("first_layers", "last_layers"):
        value = getattr(plan, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10**6:
            raise InfeasiblePlan(f"plan field '{name}' must be an integer in 0..1000000 (0 = unset), "
                                 f"got {shorten(value)}")
    if not isinstance(plan.layout, str) or len(plan.layout) > 10_000:
        raise InfeasiblePlan(f"plan field 'layout' must be a string of at most 10,000 characters, "
                             f"got {shorten(plan.layout)}")
    if plan.schedule in V_SCHEDULES:
        if plan.vpp not in (1, 2):
            raise InfeasiblePlan(f"plan: schedule={plan.schedule} runs exactly 2 chunks per rank (a V), "
                                 f"got vpp={plan.vpp}; set vpp=2 or leave it out")
        object.__setattr__(plan, "vpp", 2)
    elif plan.vpp > 1 and plan.schedule != "interleaved":
        raise InfeasiblePlan(f"plan: vpp={plan.vpp} needs schedule=interleaved "
                             f"(got schedule={plan.schedule}); set schedule=interleaved or vpp=1")
    flushes = plan.flushes
    if not isinstance(flushes, int) or isinstance(flushes, bool) or not 1 <= flushes <= 10**6:
        raise InfeasiblePlan(f"plan field 'flushes' must be an integer in 1..1000000 (1: one schedule run a step), "
                             f"got {shorten(flushes)}")
    group = plan.vpp_group
    if not isinstance(group, int) or isinstance(group, bool) or not 0 <= group <= 10**6:
        raise InfeasiblePlan(f"plan field 'vpp_group' must be an integer in 0..1000000 (0 = pp), got {shorten(group)}")
    if group and plan.schedule != "interleaved":
        raise InfeasiblePlan(f"plan: vpp_group={group} groups micro-batches of the interleaved schedule; "
                             f"set schedule=interleaved with vpp > 1, or drop vpp_group")
    uneven = plan.first_layers or plan.last_layers
    if uneven and (plan.embed_split or plan.loss_split):
        raise InfeasiblePlan("plan: first_layers/last_layers cannot be mixed with embed_split/loss_split "
                             "(Megatron-Core rejects it too); use one or give a layout")
    if plan.layout and (uneven or plan.embed_split or plan.loss_split):
        raise InfeasiblePlan("plan: layout sets every stage already; drop first_layers, last_layers, "
                             "embed_split and loss_split")


def check_dispatcher(plan) -> None:
    if plan.dispatcher not in DISPATCHERS:
        raise InfeasiblePlan(f"plan field 'dispatcher' must be one of {', '.join(DISPATCHERS)}, "
                             f"got {shorten(plan.dispatcher)}")
    if plan.ep == 1:  # nothing is dispatched across ranks
        object.__setattr__(plan, "dispatcher", "alltoall")


def check_recompute_modules(plan) -> None:
    text = plan.recompute_modules
    if not isinstance(text, str):
        raise InfeasiblePlan(f"plan field 'recompute_modules' must be names joined by '+', got {shorten(text)}")
    if not text:
        return
    names = text.split("+")
    bad = [n for n in names if n not in RECOMPUTE_MODULES]
    if bad or len(set(names)) != len(names):
        raise InfeasiblePlan(f"plan: recompute_modules={shorten(text)} must name each of "
                             f"{', '.join(RECOMPUTE_MODULES)} at most once, joined by '+'")
    if plan.recompute != "selective":
        raise InfeasiblePlan(f"plan: recompute_modules={shorten(text)} picks what selective recompute re-runs; "
                             f"set recompute=selective (got recompute={plan.recompute})")
    if plan.framework.selective_recompute != "attention":
        raise InfeasiblePlan(f"plan: recompute_modules is Megatron-Core's; framework {plan.framework.name} "
                             "recomputes by its own policy, so drop recompute_modules")
    object.__setattr__(plan, "recompute_modules", "+".join(m for m in RECOMPUTE_MODULES if m in names))


def check_offload(plan) -> None:
    """Activation offloading as Megatron-Core accepts it: pp 1, no recompute."""
    n = plan.offload_layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InfeasiblePlan(f"plan field 'offload_layers' must be a whole number >= 0, got {shorten(n)}")
    if n and plan.pp > 1:
        raise InfeasiblePlan(f"plan: offload_layers={n} with pp={plan.pp}; Megatron-Core offloads activations "
                             "only without pipeline parallelism: set pp=1 or offload_layers=0")
    if n and plan.recompute != "none":
        raise InfeasiblePlan(f"plan: offload_layers={n} with recompute={plan.recompute}; Megatron-Core does not "
                             "offload activations under recompute: set recompute=none or offload_layers=0")


def check_recompute_layers(plan) -> None:
    """Partial full recompute as Megatron-Core's block method takes it: a count with recompute=full."""
    n = plan.recompute_layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InfeasiblePlan(f"plan field 'recompute_layers' must be a whole number >= 0, got {shorten(n)}")
    if n and plan.recompute != "full":
        raise InfeasiblePlan(f"plan: recompute_layers={n} picks how many layers of each chunk full recompute "
                             f"re-runs; set recompute=full (got recompute={plan.recompute}) or recompute_layers=0")


def check_ep_overlap(plan) -> None:
    """Combined-1F1B all-to-all overlap as Megatron-Core accepts it (Megatron-Bridge's CommOverlapConfig checks)."""
    if not isinstance(plan.ep_overlap, bool):
        raise InfeasiblePlan(f"plan field 'ep_overlap' must be on or off, got {shorten(plan.ep_overlap)}")
    if not plan.ep_overlap:
        return
    if plan.ep == 1:  # no expert all-to-alls to hide: the same plan as ep_overlap=off
        object.__setattr__(plan, "ep_overlap", False)
        return
    if plan.schedule not in ("1f1b", "interleaved") or (plan.pp > 1 and plan.schedule != "interleaved"):
        raise InfeasiblePlan(f"plan: ep_overlap=on with pp={plan.pp} schedule={plan.schedule}; Megatron-Core merges "
                             "forward and backward only with pp=1 or the interleaved schedule (vpp > 1)")
    if plan.recompute == "full":
        raise InfeasiblePlan("plan: ep_overlap=on with recompute=full; Megatron-Core refuses the pair, "
                             "use recompute=selective or none, or ep_overlap=off")
    if plan.moe_overlap:
        raise InfeasiblePlan("plan: ep_overlap=on and moe_overlap=on exclude each other in Megatron-Core; "
                             "set moe_overlap=off")
