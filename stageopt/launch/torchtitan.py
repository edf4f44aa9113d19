"""torchtitan's TOML job file for a plan (``--job.config_file``; torchtitan v0.2.x).

Section and key names are torchtitan's ``JobConfig`` (torchtitan/config/
job_config.py, v0.2.2, the last release read from TOML; the same keys are its
``--section.key`` command-line flags). ``tests/launch/test_export.py`` keeps the list.

How stageopt's plan maps:

* ZeRO 3 is FSDP2 resharding after forward, ZeRO 2 FSDP2 keeping parameters
  gathered until backward, ZeRO 0 replication (DDP). torchtitan has no ZeRO 1.
* TP always comes with sequence-parallel norms in torchtitan, so ``sp=off``
  with tp > 1 cannot be run there; ``tp_overlap`` is async TP (needs compile).
* The batch: ``local_batch_size`` is per data-parallel rank. With pipeline
  parallelism it holds one flush's micro-batches (``pipeline_parallel_microbatch_size``
  each), the plan's ``flushes`` the gradient accumulation steps up to ``global_batch_size``;
  without, it is one micro-batch and the rest is gradient accumulation.
* Pipeline stages get exactly the simulated layers (``module_fqns_per_model_part``).
* ``recompute=selective`` becomes torchtitan's op-level selective checkpointing
  (recompute cheap ops, keep matmul and attention outputs), the nearest it has.
* ``recompute=full recompute_layers=N`` becomes per-layer selective checkpointing
  every k-th layer, k = the chunk's layers / N (the same number of recomputed layers).
"""

from __future__ import annotations

from typing import Any

import tomli_w

from stageopt.launch.common import LaunchSettings, chunk_layers, refuse
from stageopt.model import ModelSpec
from stageopt.parallel.plan import Plan

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zbv": "ZBVZeroBubble",
             "dualpipev": "DualPipeV"}
MODELS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
          "deepseek-v3": ("deepseek_v3", "671B")}  # stageopt preset -> torchtitan model name and flavor


def torchtitan_settings(model: ModelSpec, plan: Plan) -> LaunchSettings:
    """A torchtitan job TOML that runs ``plan`` as it was simulated."""
    _check(plan)
    config: dict[str, Any] = {}
    notes: list[str] = []
    if model.name in MODELS:
        name, flavor = MODELS[model.name]
        config["model"] = {"name": name, "flavor": flavor}
    else:
        notes.append(f"model {model.name!r} has no torchtitan flavor known to stageopt: add [model] name and flavor")
    if plan.dtype == "fp8":
        kind = "mx" if plan.fp8_recipe == "mxfp8" else "float8"  # torchao's MXFP8, else its tensorwise Float8
        converters = [f"quantize.linear.{kind}"] + ([f"quantize.grouped_mm.{kind}"] if model.is_moe else [])
        config.setdefault("model", {})["converters"] = converters
        if plan.fp8_params and plan.zero >= 2:
            notes.append("fp8_params=on: turn on torchao's FSDP float8 all-gather (enable_fsdp_float8_all_gather in the "
                         "float8 converter's section), which gathers the weights in FP8 as simulated")
        if plan.fp8_recipe == "delayed":
            notes.append("fp8_recipe=delayed: torchao's Float8 scales each tensor from its current amax (no delayed "
                         "scaling); simulate with fp8_recipe=tensorwise to match")
    config["training"] = _training(model, plan)
    config["parallelism"] = _parallelism(model, plan, notes)
    config["activation_checkpoint"] = _checkpointing(model, plan)
    if plan.tp_overlap and plan.tp > 1:
        config["compile"] = {"enable": True, "components": ["model", "loss"]}  # async TP runs only compiled
    if not plan.dp_overlap:
        notes.append("dp_overlap=off: FSDP2 always prefetches and overlaps its collectives in torchtitan")
    if plan.grad_dtype != "fp32" and plan.dp * plan.cp > 1:
        notes.append(f"grad_dtype={plan.grad_dtype}: torchtitan reduces gradients in float32 only "
                     "(training.mixed_precision_reduce); simulate with grad_dtype=fp32 to match")
    head = (f"# stageopt export: {model.name} on {plan.gpus} GPUs, plan {plan}\n"
            f"# world size {plan.gpus} (GPUs per node x nodes)\n")
    return LaunchSettings("torchtitan", head + tomli_w.dumps(config), config, tuple(notes))


def _check(plan: Plan) -> None:
    if plan.tp > 1 and not plan.sp:
        raise refuse("torchtitan", "its tensor parallelism always shards norms along the sequence (sp=on)",
                     "export the plan with sp=on")
    if plan.zero == 1:
        raise refuse("torchtitan", "torchtitan has no ZeRO-1 (FSDP2 shards parameters and gradients too)",
                     "export the plan with zero=2 or zero=3 (FSDP2), or zero=0 (DDP)")
    if plan.dtype in ("fp16", "nvfp4"):
        raise refuse("torchtitan", f"torchtitan trains in bf16, fp8 (torchao) or fp32, not {plan.dtype}",
                     "export with dtype=bf16 or dtype=fp8")
    if plan.offload_layers:
        raise refuse("torchtitan", "torchtitan has no per-layer activation offloading (Megatron-Core's)",
                     "export with offload_layers=0, or to Megatron-LM or Megatron-Bridge")
    if plan.ep_overlap:
        raise refuse("torchtitan", "torchtitan has no combined-1F1B all-to-all overlap (Megatron-Core's)",
                     "export with ep_overlap=off, or to Megatron-LM or Megatron-Bridge")
    if plan.cuda_graphs:
        raise refuse("torchtitan", "torchtitan has no full-iteration CUDA graphs for training (Megatron-Core's)",
                     "export with cuda_graphs=off, or to Megatron-LM or Megatron-Bridge")


def _training(model: ModelSpec, plan: Plan) -> dict[str, Any]:
    local = plan.gbs // (plan.dp * plan.flushes) if plan.pp > 1 else plan.mbs
    return {"local_batch_size": local, "global_batch_size": plan.gbs, "seq_len": model.seq,
            "mixed_precision_param": "float32" if plan.dtype == "fp32" else "bfloat16",
            "mixed_precision_reduce": "float32"}


def _parallelism(model: ModelSpec, plan: Plan, notes: list[str]) -> dict[str, Any]:
    shard = plan.shard_dp if plan.zero >= 2 else 1  # HSDP: shard inside a copy, replicate the copies
    out: dict[str, Any] = {"data_parallel_replicate_degree": plan.dp // shard, "data_parallel_shard_degree": shard,
                           "tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": plan.pp,
                           "context_parallel_degree": plan.cp}
    if plan.zero >= 2:
        out["fsdp_reshard_after_forward"] = "always" if plan.zero == 3 else "never"
    elif plan.cp > 1:
        notes.append("zero=0 with cp > 1: torchtitan still shards states over the cp ranks (FSDP2 on dp_shard x cp)")
    if plan.tp_overlap and plan.tp > 1:
        out["enable_async_tensor_parallel"] = True
    if plan.cp > 1:
        if plan.cp_comm == "a2a+p2p":
            raise refuse("torchtitan", "torchtitan has no hierarchical context parallelism (cp_comm=a2a+p2p)",
                         "export the plan with cp_comm=p2p or all_gather, or to megatron")
        out["context_parallel_rotate_method"] = "allgather"
    if plan.pp > 1:
        if plan.schedule not in SCHEDULES:
            raise refuse("torchtitan", f"torchtitan has no {plan.schedule} schedule",
                         f"export a plan with one of {', '.join(SCHEDULES)}")
        out["pipeline_parallel_schedule"] = SCHEDULES[plan.schedule]
        out["pipeline_parallel_microbatch_size"] = plan.mbs
        out["module_fqns_per_model_part"] = module_fqns(chunk_layers(model, plan))
    if model.is_moe:
        out["expert_parallel_degree"] = plan.ep
        out["expert_tensor_parallel_degree"] = plan.expert_tp if plan.ep > 1 else 1
        # torchtitan borrows expert parallelism from cp then dp_shard (and tp with etp=1): the ranks
        # stageopt's expert layout gives it (stageopt.parallel.ranks), so there is nothing to note.
    return out


def module_fqns(counts: list[int]) -> list[list[str]]:
    """torchtitan module names of each model part: embeddings first, norm and output last."""
    parts, start = [], 0
    for n in counts:
        parts.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _checkpointing(model: ModelSpec, plan: Plan) -> dict[str, Any]:
    if plan.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    if plan.recompute_layers:
        return {"mode": "selective", "selective_ac_option": str(_checkpoint_every(model, plan))}
    return {"mode": plan.recompute}


def _checkpoint_every(model: ModelSpec, plan: Plan) -> int:
    """torchtitan's per-layer selective option checkpoints every k-th layer of a model part: the same count
    of recomputed layers as ``recompute_layers`` when every chunk holds k times that many."""
    n, layers = plan.recompute_layers, set(chunk_layers(model, plan))
    if len(layers) != 1 or next(iter(layers)) % n:
        raise refuse("torchtitan", f"recompute_layers={n} recomputes the first {n} layers of each chunk, and "
                     f"torchtitan checkpoints every k-th layer instead; its chunks hold {sorted(layers)} layers",
                     "export with a recompute_layers that divides every chunk's layer count")
    return next(iter(layers)) // n
