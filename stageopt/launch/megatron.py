"""Megatron-LM / Megatron-Core (``pretrain_gpt.py``) arguments for a plan.

Flag names and values are the ones Megatron-LM documents (docs/user-guide/
parallelism-guide.md, features/pipeline_parallel_layout.md, features/
megatron_fsdp.md, examples/llama/train_llama3_8b_h100_fp8.sh) or generates
from its config dataclasses (TransformerConfig.recompute_method ->
``--recompute-method``); ``tests/launch/test_export.py`` keeps the list.
Model-architecture flags (``--num-layers``, ``--hidden-size``, ...) belong to
the user's model recipe and are not repeated here, except ``--seq-length``,
which is a training choice.

How stageopt's plan maps:

* ZeRO 1 is Megatron's distributed optimizer; ZeRO 2 and 3 are Megatron FSDP
  with ``optim_grads`` and ``optim_grads_params`` sharding.
* ``recompute=full`` re-runs every layer from its input: granularity full,
  method uniform, one layer per checkpoint; ``selective`` is Megatron's selective
  (attention core) recompute.
* Layers are placed as the simulators placed them: an even split uses
  ``--num-layers-per-virtual-pipeline-stage``, an uneven one the explicit
  ``--pipeline-model-parallel-layout`` (embedding ``E`` on the first chunk, loss
  ``L`` on the last).
* Context parallelism is written as simulated (``--cp-comm-type`` all_gather,
  p2p or a2a, the values Transformer Engine takes); flash attention runs as Transformer Engine's fused (cuDNN) kernel.
"""

from __future__ import annotations

from stageopt.launch.common import LaunchSettings, chunk_layers, refuse
from stageopt.model import ModelSpec
from stageopt.parallel.plan import Plan

Flag = tuple[str, str | None]  # ("--micro-batch-size", "1") or ("--sequence-parallel", None)


LIST_FLAGS = ("--recompute-modules", "--hierarchical-context-parallel-sizes",)  # nargs="+": one argv token per value


def megatron_settings(model: ModelSpec, plan: Plan) -> LaunchSettings:
    """Arguments for ``pretrain_gpt.py`` that run ``plan`` as it was simulated."""
    if plan.schedule not in ("1f1b", "interleaved"):
        names = {"gpipe": "GPipe", "zbh1": "ZB-H1", "zb2p": "ZB-2p", "zbv": "ZB-V", "dualpipe": "DualPipe",
                 "dualpipev": "DualPipeV"}
        raise refuse("megatron", f"Megatron-Core has no {names[plan.schedule]} schedule",
                     "export a plan with schedule=1f1b or schedule=interleaved")
    if plan.flushes > 1:
        raise refuse("megatron", "Megatron-Core runs a step's micro-batches in one pipeline flush",
                     "export the plan with flushes=1 (the same micro-batches, one flush), or to torchtitan")
    if plan.tp_overlap and plan.tp > 1 and not plan.sp:
        raise refuse("megatron", "--tp-comm-overlap needs --sequence-parallel",
                     "export the plan with sp=on, or with tp_overlap=off")
    flags = (_degrees(model, plan) + _pipeline(model, plan) + _batch(model, plan) + _data_parallel(plan)
             + _memory(plan) + _precision(plan) + _execution(model, plan))
    notes = ["model architecture flags (--num-layers, --hidden-size, --num-attention-heads, ...) come from your "
             "model recipe"]
    if plan.zero == 0 and plan.dp * plan.cp > 1:
        notes.append("zero=0: plain data parallelism (no distributed optimizer)")
    args = [token for flag, value in flags
            for token in ((flag,) if value is None else (flag, *(value.split() if flag in LIST_FLAGS else [value])))]
    text = " \\\n".join(flag if value is None else f"{flag} {value}" for flag, value in flags)
    return LaunchSettings("megatron", text, {"args": args}, tuple(notes))


def _degrees(model: ModelSpec, plan: Plan) -> list[Flag]:
    flags: list[Flag] = [("--tensor-model-parallel-size", str(plan.tp)),
                         ("--pipeline-model-parallel-size", str(plan.pp)),
                         ("--context-parallel-size", str(plan.cp)),
                         ("--expert-model-parallel-size", str(plan.ep))]
    if model.is_moe:
        flags.append(("--expert-tensor-parallel-size", str(plan.expert_tp)))  # as the experts were simulated
        if plan.dispatcher == "flex":
            flags += [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
        if plan.ep_overlap:
            flags.append(("--overlap-moe-expert-parallel-comm", None))
    if plan.cp > 1:
        flags.append(("--cp-comm-type", plan.cp_comm))
        if plan.cp_comm == "a2a+p2p":  # all-to-all groups inside, the ring over them
            flags.append(("--hierarchical-context-parallel-sizes", f"{plan.cpa} {plan.cp // plan.cpa}"))
    if plan.sp:
        flags.append(("--sequence-parallel", None))
    if plan.cuda_graphs:
        flags.append(("--cuda-graph-impl", "full_iteration"))
    return flags


def _pipeline(model: ModelSpec, plan: Plan) -> list[Flag]:
    if plan.pp * plan.vpp == 1:
        return []
    counts = chunk_layers(model, plan)
    if len(set(counts)) == 1:
        return [("--num-layers-per-virtual-pipeline-stage", str(counts[0]))] if plan.vpp > 1 else []
    return [("--pipeline-model-parallel-layout", f'"{pipeline_layout(counts)}"')]


def pipeline_layout(counts: list[int]) -> str:
    """Megatron's layout string for layers per chunk: ``E,t*3|t*4|t*3,L`` (chunks split by ``|``)."""
    chunks = [f"t*{n}" if n > 1 else "t" * n for n in counts]
    chunks[0] = ",".join(filter(None, ("E", chunks[0])))
    chunks[-1] = ",".join(filter(None, (chunks[-1], "L")))
    return "|".join(chunks)


def _batch(model: ModelSpec, plan: Plan) -> list[Flag]:
    return [("--micro-batch-size", str(plan.mbs)), ("--global-batch-size", str(plan.gbs)),
            ("--seq-length", str(model.seq))]


def _data_parallel(plan: Plan) -> list[Flag]:
    flags: list[Flag] = []
    if plan.dp_replicate > 1:  # HSDP: the distributed optimizer / Megatron-FSDP shards inside each copy
        flags.append(("--num-distributed-optimizer-instances", str(plan.dp_replicate)))
    if plan.zero == 1:
        flags.append(("--use-distributed-optimizer", None))
    elif plan.zero in (2, 3):
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        flags += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", strategy),
                  ("--ckpt-format", "fsdp_dtensor")]
    if plan.bucket_mb:
        flags.append(("--ddp-bucket-size", str(plan.fixed_bucket_params)))
    if plan.dp_overlap and plan.dp * plan.cp > 1:
        flags.append(("--overlap-grad-reduce", None))
        if plan.zero >= 1:
            flags.append(("--overlap-param-gather", None))
    return flags


def _memory(plan: Plan) -> list[Flag]:
    if plan.offload_layers:  # the plan checks leave recompute=none here
        return [("--cpu-offloading", None), ("--cpu-offloading-num-layers", str(plan.offload_layers))]
    if plan.recompute == "selective":
        modules = [("--recompute-modules", plan.recompute_modules.replace("+", " "))] if plan.recompute_modules else []
        return [("--recompute-granularity", "selective"), *modules]
    if plan.recompute == "full" and plan.recompute_layers:  # only the first N layers of each chunk
        return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", str(plan.recompute_layers))]
    if plan.recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", "1")]
    return []


def _precision(plan: Plan) -> list[Flag]:
    flags: list[Flag] = {"bf16": [("--bf16", None)], "fp16": [("--fp16", None)],
                         "fp8": [("--bf16", None), ("--fp8-format", "hybrid"), ("--fp8-recipe", plan.fp8_recipe)],
                         "nvfp4": [("--bf16", None), ("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")],
                         "fp32": []}[plan.dtype]
    if plan.dtype in ("fp8", "nvfp4") and plan.fp8_params:  # weights held and gathered in low precision
        flags.append(("--fp8-param-gather" if plan.dtype == "fp8" else "--fp4-param-gather", None))
    if plan.grad_dtype == "bf16" and plan.dtype in ("bf16", "fp8", "nvfp4"):
        flags.append(("--grad-reduce-in-bf16", None))  # gradients were simulated in bf16
    if plan.adam_moments == "bf16":
        flags += [("--use-precision-aware-optimizer", None), ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    return flags


def _execution(model: ModelSpec, plan: Plan) -> list[Flag]:
    """The framework profile's options that Megatron does not default to."""
    stack = plan.framework
    attention = stack.attention or model.attention
    dropout = model.dropout if stack.dropout is None else stack.dropout
    flags: list[Flag] = [("--attention-backend", "fused" if attention == "flash" else "unfused")]
    if not dropout:
        flags += [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0")]  # Megatron's defaults are 0.1
    if plan.tp_overlap and plan.tp > 1:
        flags.append(("--tp-comm-overlap", None))
    return flags
