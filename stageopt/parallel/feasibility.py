"""Check a Plan against a model and a cluster, one named rule at a time."""

from __future__ import annotations

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks.profile import LOW_PRECISION_RECIPES
from stageopt.model.spec import ModelSpec
from stageopt.parallel.pipeline_split import ModelStage, split_layers
from stageopt.parallel.placement import V_SHAPED, model_stage_count
from stageopt.parallel.plan import Plan


def validate_plan(plan: Plan, model: ModelSpec, gpus: int | None = None) -> None:
    """Raise InfeasiblePlan for the first rule the plan breaks."""
    if gpus is not None and plan.gpus != gpus:
        raise InfeasiblePlan(
            f"plan: dp*tp*cp*pp = {plan.dp}*{plan.tp}*{plan.cp}*{plan.pp} = {plan.gpus} "
            f"but gpus={gpus}; drop dp from the plan to derive it, or fix the degrees")
    stack = plan.framework
    if plan.pp > 1 and plan.schedule not in stack.schedules:
        raise InfeasiblePlan(f"plan: schedule={plan.schedule} is not implemented by framework {stack.name} "
                             f"(it runs {', '.join(stack.schedules)}); choose one of those or another --framework")
    if plan.dtype in LOW_PRECISION_RECIPES and plan.dtype not in stack.low_precision:
        shipped = ", ".join(stack.low_precision) or "none"
        raise InfeasiblePlan(f"plan: dtype={plan.dtype} has no recipe in framework {stack.name} (its low-precision "
                             f"recipes: {shipped}); use dtype=bf16 or another --framework")
    _divides(plan.tp, "tp", model.heads, "heads")
    _divides(plan.tp, "tp", model.kv_heads, "kv_heads")
    _divides(plan.tp, "tp", model.ffn, "ffn")
    _divides(plan.tp, "tp", model.vocab, "vocab")
    if plan.cp_comm in ("a2a", "a2a+p2p") and plan.cp > 1:  # Ulysses splits the heads over its cp ranks (and tp)
        part, degree = ("cp", plan.cp) if plan.cp_comm == "a2a" else ("cp_a2a", plan.cpa)
        for field, value in (("heads", model.heads), ("kv_heads", model.kv_heads)):
            if value % (plan.tp * degree):
                raise InfeasiblePlan(f"plan: cp_comm={plan.cp_comm} splits attention heads over tp*{part} = "
                                     f"{plan.tp * degree}, which does not divide {field}={value}; lower {part} "
                                     "or use cp_comm=all_gather/p2p")
    if model.has_ssm:
        _divides(plan.tp, "tp", model.ssm_heads, "ssm_heads")
        _divides(plan.tp, "tp", model.ssm_groups, "ssm_groups")
        if plan.cp > 1:
            raise InfeasiblePlan(f"plan: cp={plan.cp} on {model.name}: context parallelism across Mamba-2 layers "
                                 "(a sequential state) is not modelled; set cp=1")
    _check_experts(plan, model)
    seq_split = plan.cp * (plan.tp if plan.sp else 1) * (2 if plan.cp > 1 else 1)
    if model.seq % seq_split:
        why = "2*cp*tp (load-balanced CP with SP)" if plan.sp else "2*cp (load-balanced CP)"
        if plan.cp == 1:
            why = "tp (sequence parallelism)"
        raise InfeasiblePlan(f"plan: seq={model.seq} is not divisible by {why} = {seq_split}; "
                             "change cp/tp or the sequence length")
    model_stages(plan, model.layers, model.mtp_layers)  # raises for a split Megatron-Core would reject
    _check_offload(plan, model)
    if plan.gbs % (plan.mbs * plan.dp):
        raise InfeasiblePlan(
            f"plan: gbs={plan.gbs} is not divisible by mbs*dp = {plan.mbs}*{plan.dp} = {plan.mbs * plan.dp}; "
            f"use gbs a multiple of {plan.mbs * plan.dp}")
    if plan.gbs % (plan.mbs * plan.dp * plan.flushes):
        per = plan.gbs // (plan.mbs * plan.dp)
        raise InfeasiblePlan(f"plan: flushes={plan.flushes} does not divide the {per} micro-batches of a step "
                             f"(gbs/(mbs*dp)); use flushes dividing {per}")
    if plan.schedule == "interleaved" and plan.pp > 1:
        _check_microbatch_groups(plan)
    if plan.schedule == "interleaved" and plan.pp == 1:
        raise InfeasiblePlan("plan: schedule=interleaved needs pp > 1; use schedule=1f1b")
    _check_schedule(plan)  # zero>0 with dp*cp = 1 is accepted, as Megatron-Core accepts it: one shard, no sharding


def _check_experts(plan: Plan, model: ModelSpec) -> None:
    if not model.is_moe:
        if plan.ep > 1:
            raise InfeasiblePlan(f"plan: ep={plan.ep} on dense model {model.name}; set ep=1")
        return
    _divides(plan.tp, "tp", model.expert_ffn, "expert_ffn")
    _divides(plan.ep, "ep", model.experts, "experts")
    stage_ranks = plan.tp * plan.cp * plan.dp
    if stage_ranks % (plan.expert_tp * plan.ep):
        raise InfeasiblePlan(
            f"plan: ep={plan.ep} x etp={plan.expert_tp} does not divide a stage's tp={plan.tp} x cp={plan.cp} "
            f"x dp={plan.dp} = {stage_ranks} ranks, which expert layers take as etp x ep x expert-DP "
            f"(Megatron-Core's folding); pick ep dividing {stage_ranks // plan.expert_tp}"
            + ("" if plan.expert_tp == 1 else ", or etp=1"))


def _check_offload(plan: Plan, model: ModelSpec) -> None:
    if plan.offload_layers >= model.layers:
        raise InfeasiblePlan(f"plan: offload_layers={plan.offload_layers} on {model.name}, which has {model.layers} "
                             f"layers; offload at most {model.layers - 1} (Megatron-Core's bound)")


def _check_schedule(plan: Plan) -> None:
    """Rules of the zero-bubble and DualPipe schedules (their reference implementations assert the same)."""
    p, m = plan.pp, plan.microbatches
    if plan.schedule in ("zbv", "dualpipe", "dualpipev") and p == 1:
        raise InfeasiblePlan(f"plan: schedule={plan.schedule} needs pp > 1; use schedule=1f1b")
    if plan.schedule == "dualpipe":
        if p % 2:
            raise InfeasiblePlan(f"plan: schedule=dualpipe needs an even pp (two directions meet in the middle), "
                                 f"got pp={p}; use an even pp or schedule=dualpipev")
        if m % 2 or m < 2 * p:
            raise InfeasiblePlan(f"plan: schedule=dualpipe needs an even number of micro-batches >= 2*pp = {2 * p}, "
                                 f"got {m}; raise gbs or lower mbs")
    if plan.schedule == "dualpipev" and m < 2 * p:
        raise InfeasiblePlan(f"plan: schedule=dualpipev needs micro-batches >= 2*pp = {2 * p}, got {m}; "
                             "raise gbs or lower mbs")


def model_stages(plan: Plan, layers: int, mtp: int = 0) -> list[ModelStage]:
    """Layers (and embedding, loss) of each model stage of one model copy under the plan."""
    n_model = model_stage_count(plan.schedule, plan.pp, plan.vpp)
    vpp = n_model // plan.pp
    if plan.schedule in V_SHAPED and (plan.first_layers or plan.last_layers):
        raise InfeasiblePlan(f"plan: first_layers/last_layers name pipeline ranks of a looped schedule; "
                             f"schedule={plan.schedule} puts both ends on rank 0, so give a layout or "
                             "embed_split/loss_split instead")
    return split_layers(layers, plan.pp, vpp, mtp=mtp, **plan.pipeline_split)


def _divides(degree: int, name: str, value: int, field: str) -> None:
    if value % degree:
        options = [d for d in (1, 2, 4, 8, 16, 32, 64) if value % d == 0 and d <= value]
        raise InfeasiblePlan(f"plan: {name}={degree} does not divide {field}={value}; "
                             f"use {name} in {{{', '.join(map(str, options))}}}")


def _check_microbatch_groups(plan: Plan) -> None:
    """Megatron-Core's rules for the interleaved schedule's micro-batch groups (pipeline_parallel/schedules.py):
    a group holds pp..m micro-batches, and a last, shorter group at least pp (fewer would wait on the pipeline)."""
    m, group, pp = plan.microbatches, plan.microbatch_group, plan.pp
    if plan.vpp_group and not pp <= group <= m:
        raise InfeasiblePlan(f"plan: the interleaved schedule runs vpp_group={group} micro-batches through a chunk "
                             f"in a row, which must lie in [pp={pp}, micro-batches={m}]; raise gbs or set vpp_group "
                             "in that range")
    if 0 < m % group < pp and group == pp:
        raise InfeasiblePlan(f"plan: interleaved schedule needs micro-batches ({m}) divisible by pp={pp}; raise gbs "
                             "or change mbs (or set vpp_group above pp, leaving a last group of at least pp)")
    if 0 < m % group < pp:
        raise InfeasiblePlan(f"plan: {m} micro-batches in groups of vpp_group={group} leave {m % group}, fewer than "
                             f"pp={pp} (a dependency bubble Megatron-Core rejects); choose a vpp_group that divides "
                             f"{m} or leaves at least {pp}")
