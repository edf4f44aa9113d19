"""The text form of a plan: ``"tp=8 pp=4 ..."`` split into typed fields.

Why apart from :mod:`stageopt.parallel.plan`: the spellings users type (Megatron-Core's
argument names, commas, a layout with spaces) are a parsing concern, not a plan's.
"""

from __future__ import annotations

import difflib

from stageopt.errors import InfeasiblePlan
from stageopt.inputs.gate import clip

_INT_FIELDS = ("dp", "tp", "cp", "pp", "ep", "vpp", "mbs", "gbs", "zero", "first_layers", "last_layers", "dp_shard",
               "etp", "cp_a2a", "offload_layers", "recompute_layers", "vpp_group", "bucket_mb", "flushes")
_BOOL_FIELDS = ("sp", "dp_overlap", "tp_overlap", "embed_split", "loss_split", "moe_overlap", "ep_overlap",
                "cuda_graphs", "fp8_params")
_ALIASES = {"micro_batch": "mbs", "global_batch": "gbs", "interleave": "vpp",
            # Megatron-Core's argument names (dashes or underscores)
            "decoder_first_pipeline_num_layers": "first_layers", "num_layers_in_first_pipeline_stage": "first_layers",
            "decoder_last_pipeline_num_layers": "last_layers", "num_layers_in_last_pipeline_stage": "last_layers",
            "account_for_embedding_in_pipeline_split": "embed_split",
            "account_for_loss_in_pipeline_split": "loss_split",
            "pipeline_model_parallel_layout": "layout", "cp_comm_type": "cp_comm",
            "moe_shared_expert_overlap": "moe_overlap",
            "overlap_moe_expert_parallel_comm": "ep_overlap", "moe_a2a_overlap": "ep_overlap",  # Bridge's name
            "virtual_pipeline_model_parallel_size": "vpp", "num_virtual_stages_per_pipeline_rank": "vpp",
            "microbatch_group_size_per_vp_stage": "vpp_group",  # Megatron-Core's config name (Bridge's too)
            "microbatch_group_size_per_virtual_pipeline_stage": "vpp_group",  # its command-line name
            "data_parallel_shard_degree": "dp_shard",  # torchtitan's name
            "expert_tensor_parallel_size": "etp", "cpu_offloading_num_layers": "offload_layers",
            "recompute_num_layers": "recompute_layers",
            "bucket_cap_mb": "bucket_mb"}  # NeMo 1's / Apex distributed Adam's name


def parse_fields(text: str, known: list[str]) -> dict[str, object]:
    """``key=value`` items of a plan string, typed, with Megatron-style keys mapped to ``known`` field names."""
    fields: dict[str, object] = {}
    for item in _plan_items(text):
        key, sep, raw = item.partition("=")
        key = _canonical(key)
        if not sep or not raw:
            raise InfeasiblePlan(f"plan item '{clip(item)}' is not key=value; write e.g. \"tp=8 pp=4\"")
        if key not in known:
            hint = difflib.get_close_matches(key, known, n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else f"known keys: {' '.join(known)}"
            raise InfeasiblePlan(f"plan: unknown key '{clip(key)}'; {fix}")
        if key in fields:
            raise InfeasiblePlan(f"plan: '{key}' is given twice; keep one")
        if key in _INT_FIELDS:
            try:
                fields[key] = int(raw)
            except ValueError:
                raise InfeasiblePlan(f"plan: {key}={clip(raw)} is not an integer") from None
        elif key in _BOOL_FIELDS:
            if raw.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise InfeasiblePlan(f"plan: {key}={clip(raw)} must be on or off")
            fields[key] = raw.lower() in ("on", "true", "1")
        else:
            fields[key] = raw.strip("'\"") if key == "layout" else raw
    return fields


def _canonical(key: str) -> str:
    """A plan key with Megatron-style spellings (``--decoder-first-pipeline-num-layers``) mapped to ours."""
    plain = key.replace("-", "_").lstrip("_")
    return _ALIASES.get(plain, plain)


def _plan_items(text: str) -> list[str]:
    """Split a plan string on spaces and commas, except inside a ``layout=...`` value (commas are cosmetic there)."""
    items: list[str] = []
    for raw in text.split():
        if _canonical(raw.partition("=")[0]) == "layout":
            items.append(raw)
        elif items and "=" not in raw and _canonical(items[-1].partition("=")[0]) == "layout":
            items[-1] += raw
        else:
            items += [part for part in raw.split(",") if part]
    return items


def plan_text(plan) -> str:
    """The plan as the text ``Plan.parse`` reads back: every degree, then only the knobs that differ from
    their defaults (or from the stack's), then the stack's name."""
    def on(flag: bool | None) -> str:
        return "on" if flag else "off"

    stack_grad = plan.framework.default_grad_dtype(plan.dtype)
    text = (f"tp={plan.tp} pp={plan.pp} dp={plan.dp} cp={plan.cp} ep={plan.ep} vpp={plan.vpp} "
            f"mbs={plan.mbs} gbs={plan.gbs} zero={plan.zero} recompute={plan.recompute} "
            f"sp={on(plan.sp)} schedule={plan.schedule} dtype={plan.dtype} tp_overlap={on(plan.tp_overlap)} "
            f"dp_overlap={on(plan.dp_overlap)}")
    extra = [f"first_layers={plan.first_layers}" if plan.first_layers else "",
             f"last_layers={plan.last_layers}" if plan.last_layers else "",
             "embed_split=on" if plan.embed_split else "", "loss_split=on" if plan.loss_split else "",
             f"layout={plan.layout}" if plan.layout else "",
             f"vpp_group={plan.vpp_group}" if plan.vpp_group else "",
             f"flushes={plan.flushes}" if plan.flushes > 1 else "",
             f"cp_comm={plan.cp_comm}" if plan.cp_comm != "all_gather" else "",
             f"cp_a2a={plan.cp_a2a}" if plan.cp_a2a else "",
             "moe_overlap=on" if plan.moe_overlap else "", "ep_overlap=on" if plan.ep_overlap else "",
             "cuda_graphs=on" if plan.cuda_graphs else "",
             f"dp_shard={plan.dp_shard}" if plan.dp_shard else "", f"etp={plan.etp}" if plan.etp else "",
             f"grad_dtype={plan.grad_dtype}" if plan.grad_dtype != stack_grad else "",
             f"fp8_recipe={plan.fp8_recipe}" if plan.fp8_recipe != plan.framework.fp8_recipe else "",
             f"fp8_params={on(plan.fp8_params)}" if plan.fp8_params != plan.framework.fp8_params else "",
             f"dispatcher={plan.dispatcher}" if plan.dispatcher != "alltoall" else "",
             f"recompute_modules={plan.recompute_modules}" if plan.recompute_modules else "",
             f"adam_moments={plan.adam_moments}" if plan.adam_moments != "fp32" else "",
             f"bucket_mb={plan.bucket_mb}" if plan.bucket_mb else "",
             f"offload_layers={plan.offload_layers}" if plan.offload_layers else "",
             f"recompute_layers={plan.recompute_layers}" if plan.recompute_layers else ""]
    return " ".join([text, *[e for e in extra if e], f"framework={plan.framework.name}"])
