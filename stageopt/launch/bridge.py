"""Megatron-Bridge (NeMo 2's training library) recipe overrides for a plan: ``key=value`` items in
the Hydra/OmegaConf syntax its training scripts take after the recipe.

Names are Megatron-Bridge's ``ConfigContainer`` fields as its docs write them
(docs/megatron-lm-to-megatron-bridge.md, nemo2-migration-guide.md, training/
activation-recomputation.md, communication-overlap.md, mixed-precision.md,
megatron-fsdp.md, performance-guide.md); ``tests/launch/test_export.py`` keeps
the list. A recipe sets its own defaults, so every choice the plan makes is
written out, including the ones that are off. The mapping is the Megatron one
(:mod:`stageopt.launch.megatron`): same ZeRO, recompute, layout and precision rules.
"""

from __future__ import annotations

import shlex

from stageopt.launch.common import LaunchSettings, chunk_layers, refuse
from stageopt.launch.megatron import pipeline_layout
from stageopt.model import ModelSpec
from stageopt.parallel.plan import Plan

MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "nvfp4": "bf16_with_nvfp4_mixed"}
FP8_MIXED_PRECISION = {"delayed": "bf16_with_fp8_delayed_scaling_mixed",  # Megatron-Bridge training/mixed_precision.py
                       "tensorwise": "bf16_with_fp8_current_scaling_mixed", "mxfp8": "bf16_with_mxfp8_mixed"}


def bridge_settings(model: ModelSpec, plan: Plan) -> LaunchSettings:
    """Overrides for a Megatron-Bridge pre-training recipe that run ``plan`` as it was simulated."""
    if plan.schedule == "gpipe":
        raise refuse("megatron-bridge", "Megatron-Core has no GPipe schedule",
                     "export a plan with schedule=1f1b or schedule=interleaved")
    if plan.flushes > 1:
        raise refuse("megatron-bridge", "Megatron-Core runs a step's micro-batches in one pipeline flush",
                     "export the plan with flushes=1 (the same micro-batches, one flush), or to torchtitan")
    if plan.tp_overlap and plan.tp > 1 and not plan.sp:
        raise refuse("megatron-bridge", "TP communication overlap needs sequence parallelism",
                     "export the plan with sp=on, or with tp_overlap=off")
    if plan.dtype == "fp32":
        raise refuse("megatron-bridge", "its mixed-precision recipes are bf16, fp16, fp8 or nvfp4",
                     "export with dtype=bf16")
    items = {**_parallelism(model, plan), **_batch(model, plan), **_data_parallel(plan), **_recompute(plan),
             **_execution(model, plan), "mixed_precision": _mixed_precision(plan)}
    overrides = [f"{key}={_value(value)}" for key, value in items.items()]  # what Hydra reads
    notes = ["append to your recipe's training command (e.g. examples/recipes/...py); model architecture comes "
             "from the recipe", "gradient reduction dtype: the mixed_precision recipe's"]
    text = " \\\n".join(shlex.quote(item) for item in overrides)  # as a shell passes them
    return LaunchSettings("megatron-bridge", text, {"overrides": overrides}, tuple(notes))


def _value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"  # a Hydra list
    return f'"{value}"' if isinstance(value, str) and "|" in value else str(value)  # a quoted Hydra string


def _parallelism(model: ModelSpec, plan: Plan) -> dict[str, object]:
    out: dict[str, object] = {"model.tensor_model_parallel_size": plan.tp,
                              "model.pipeline_model_parallel_size": plan.pp,
                              "model.virtual_pipeline_model_parallel_size": plan.vpp if plan.vpp > 1 else None,
                              "model.context_parallel_size": plan.cp,
                              "model.expert_model_parallel_size": plan.ep,
                              "model.sequence_parallel": bool(plan.sp)}
    if model.is_moe:
        out["model.expert_tensor_parallel_size"] = plan.expert_tp
        if plan.dispatcher == "flex":
            out["model.moe_token_dispatcher_type"] = "flex"
            out["model.moe_flex_dispatcher_backend"] = "deepep"
    if plan.cp > 1:
        out["model.cp_comm_type"] = plan.cp_comm
        if plan.cp_comm == "a2a+p2p":  # all-to-all groups inside, the ring over them
            out["model.hierarchical_context_parallel_sizes"] = [plan.cpa, plan.cp // plan.cpa]
    counts = chunk_layers(model, plan)
    if plan.pp > 1 and len(set(counts)) > 1:
        out["model.pipeline_model_parallel_layout"] = pipeline_layout(counts).replace(",", "")  # commas are cosmetic
    return out


def _batch(model: ModelSpec, plan: Plan) -> dict[str, object]:
    return {"train.micro_batch_size": plan.mbs, "train.global_batch_size": plan.gbs,
            "model.seq_length": model.seq, "dataset.seq_length": model.seq}


def _data_parallel(plan: Plan) -> dict[str, object]:
    fsdp = plan.zero in (2, 3)
    out: dict[str, object] = {"ddp.use_distributed_optimizer": plan.zero == 1,
                              "optimizer.use_distributed_optimizer": plan.zero == 1,
                              "dist.use_megatron_fsdp": fsdp, "ddp.use_megatron_fsdp": fsdp}
    if fsdp:
        out["ddp.data_parallel_sharding_strategy"] = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        out["checkpoint.ckpt_format"] = "fsdp_dtensor"
    if plan.dp_replicate > 1:  # HSDP: the distributed optimizer / Megatron-FSDP shards inside each copy
        out["ddp.num_distributed_optimizer_instances"] = plan.dp_replicate
    overlap = bool(plan.dp_overlap) and plan.dp * plan.cp > 1
    out["ddp.overlap_grad_reduce"] = overlap
    out["ddp.overlap_param_gather"] = overlap and plan.zero >= 1
    if plan.bucket_mb:
        out["ddp.bucket_size"] = plan.fixed_bucket_params
    if plan.dtype in ("fp8", "nvfp4") and not plan.fp8_params:  # the presets gather low-precision weights
        out[f"mixed_precision.{'fp8' if plan.dtype == 'fp8' else 'fp4'}_param_gather"] = False
    if plan.adam_moments == "bf16":  # Megatron-Core's precision-aware optimizer
        out.update({"optimizer.use_precision_aware_optimizer": True, "optimizer.exp_avg_dtype": "bf16",
                    "optimizer.exp_avg_sq_dtype": "bf16"})
    return out


def _recompute(plan: Plan) -> dict[str, object]:
    if plan.recompute == "full":  # every layer (uniform, 1), or the first N of each chunk (block, N)
        return {"model.recompute_granularity": "full",
                "model.recompute_method": "block" if plan.recompute_layers else "uniform",
                "model.recompute_num_layers": plan.recompute_layers or 1}
    out: dict[str, object] = {"model.recompute_granularity": "selective" if plan.recompute == "selective" else None}
    if plan.recompute_modules:
        out["model.recompute_modules"] = plan.recompute_modules.split("+")
    if plan.offload_layers:  # activations only, as Megatron-Bridge's GB200 Llama 3 70B preset sets it
        out.update({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": plan.offload_layers,
                    "model.cpu_offloading_weights": False})
    return out


def _execution(model: ModelSpec, plan: Plan) -> dict[str, object]:
    stack = plan.framework
    attention = stack.attention or model.attention
    dropout = model.dropout if stack.dropout is None else stack.dropout
    out: dict[str, object] = {"model.attention_backend": "fused" if attention == "flash" else "unfused",
                              "comm_overlap.tp_comm_overlap": bool(plan.tp_overlap) and plan.tp > 1}
    if not dropout:
        out.update({"model.attention_dropout": 0.0, "model.hidden_dropout": 0.0})
    out["model.cuda_graph_impl"] = "full_iteration" if plan.cuda_graphs else "none"  # recipes may set graphs on
    if plan.ep_overlap:  # combined 1F1B; the harness's moe_a2a_overlap also delays wgrad, which we do not model
        out.update({"comm_overlap.overlap_moe_expert_parallel_comm": True, "model.moe_shared_expert_overlap": False})
    return out


def _mixed_precision(plan: Plan) -> str:
    """The recipe's mixed_precision preset for the plan's dtype (FP8: its scaling recipe)."""
    return FP8_MIXED_PRECISION[plan.fp8_recipe] if plan.dtype == "fp8" else MIXED_PRECISION[plan.dtype]
