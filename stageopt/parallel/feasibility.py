"""Check a Plan against a model and a cluster, one named rule at a time."""

from __future__ import annotations

from stageopt.errors import InfeasiblePlan
from stageopt.model.spec import ModelSpec
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
    _divides(plan.tp, "tp", model.heads, "heads")
    _divides(plan.tp, "tp", model.kv_heads, "kv_heads")
    _divides(plan.tp, "tp", model.ffn, "ffn")
    _divides(plan.tp, "tp", model.vocab, "vocab")
    if model.is_moe:
        _divides(plan.tp, "tp", model.expert_ffn, "expert_ffn")
        _divides(plan.ep, "ep", model.experts, "experts")
        if plan.dp % plan.ep:
            raise InfeasiblePlan(f"plan: ep={plan.ep} does not divide dp={plan.dp}; experts are "
                                 "spread over a factor of dp, so pick ep dividing dp")
    elif plan.ep > 1:
        raise InfeasiblePlan(f"plan: ep={plan.ep} on dense model {model.name}; set ep=1")
    seq_split = plan.cp * (plan.tp if plan.sp else 1) * (2 if plan.cp > 1 else 1)
    if model.seq % seq_split:
        why = "2*cp*tp (load-balanced CP with SP)" if plan.sp else "2*cp (load-balanced CP)"
        if plan.cp == 1:
            why = "tp (sequence parallelism)"
        raise InfeasiblePlan(f"plan: seq={model.seq} is not divisible by {why} = {seq_split}; "
                             "change cp/tp or the sequence length")
    chunks = plan.pp * plan.vpp
    if chunks > model.layers:
        raise InfeasiblePlan(f"plan: pp*vpp = {chunks} exceeds layers={model.layers}; "
                             "every pipeline chunk needs at least one layer")
    if plan.vpp > 1 and model.layers % chunks:
        raise InfeasiblePlan(f"plan: pp*vpp = {plan.pp}*{plan.vpp} does not divide layers={model.layers}; "
                             "interleaving needs equal chunks, pick vpp so that it divides")
    if plan.gbs % (plan.mbs * plan.dp):
        raise InfeasiblePlan(
            f"plan: gbs={plan.gbs} is not divisible by mbs*dp = {plan.mbs}*{plan.dp} = {plan.mbs * plan.dp}; "
            f"use gbs a multiple of {plan.mbs * plan.dp}")
    if plan.schedule == "interleaved" and plan.pp > 1 and plan.microbatches % plan.pp:
        raise InfeasiblePlan(f"plan: interleaved schedule needs micro-batches ({plan.microbatches}) "
                             f"divisible by pp={plan.pp}; raise gbs or change mbs")
    if plan.schedule == "interleaved" and plan.pp == 1:
        raise InfeasiblePlan("plan: schedule=interleaved needs pp > 1; use schedule=1f1b")
    if plan.zero > 0 and plan.dp * plan.cp == 1:
        raise InfeasiblePlan(f"plan: zero={plan.zero} shards over data and context parallelism, but "
                             f"dp={plan.dp} cp={plan.cp}; set zero=0 or raise dp")


def _divides(degree: int, name: str, value: int, field: str) -> None:
    if value % degree:
        options = [d for d in (1, 2, 4, 8, 16, 32, 64) if value % d == 0 and d <= value]
        raise InfeasiblePlan(f"plan: {name}={degree} does not divide {field}={value}; "
                             f"use {name} in {{{', '.join(map(str, options))}}}")
