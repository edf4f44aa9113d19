"""stageopt export: Megatron-LM arguments and torchtitan TOML use only the names those frameworks document,
and they reproduce the simulated plan (degrees multiply to the GPU count, micro-batches, layer placement).
"""

from __future__ import annotations

import json
import re

import pytest

from stageopt.cli import main
from stageopt.errors import ConfigError
from stageopt.frameworks import load_profile
from stageopt.launch import launch_settings
from stageopt.launch.megatron import pipeline_layout
from stageopt.model import load_model
from stageopt.parallel.plan import Plan

# Megatron-LM flags and their documented values. Sources (NVIDIA/Megatron-LM, commit d98e8a64):
#   P = docs/user-guide/parallelism-guide.md        L = docs/user-guide/features/pipeline_parallel_layout.md
#   A = docs/user-guide/features/fine_grained_activation_offloading.md
#   G = docs/api-guide/core/generalized_tensor_parallel.md   T = docs/user-guide/training-examples.md
#   E = examples/llama/train_llama3_8b_h100_fp8.sh
#   C = megatron/core/transformer/transformer_config.py fields, which megatron/training/arguments.py turns into
#       flags (ArgumentGroupFactory: recompute_method -> --recompute-method); AttnBackend in transformer/enums.py
MEGATRON = {
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int,  # P
    "--num-layers-per-virtual-pipeline-stage": int, "--context-parallel-size": int,  # P
    "--cp-comm-type": {"p2p", "a2a", "all_gather", "a2a+p2p"},  # P (values: C, TransformerConfig.cp_comm_type)
    "--expert-model-parallel-size": int,  # P
    "--sequence-parallel": None, "--use-distributed-optimizer": None, "--use-megatron-fsdp": None,  # P
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},  # P
    "--ckpt-format": {"torch_dist", "fsdp_dtensor"}, "--tp-comm-overlap": None,  # P
    "--overlap-grad-reduce": None, "--overlap-param-gather": None, "--micro-batch-size": int,  # P
    "--global-batch-size": int, "--seq-length": int, "--bf16": None,  # P
    "--pipeline-model-parallel-layout": str,  # L
    "--recompute-granularity": {"full", "selective"},  # A (values: C)
    "--recompute-method": {"uniform", "block"}, "--recompute-num-layers": int,  # C
    "--expert-tensor-parallel-size": int,  # G
    "--fp16": None,  # T
    "--fp8-format": {"e4m3", "hybrid"}, "--grad-reduce-in-bf16": None, "--fp8-param-gather": None,  # E
    "--ddp-bucket-size": int,  # megatron/training/arguments.py (DistributedDataParallelConfig.bucket_size, elements)
    "--fp8-recipe": {"delayed", "tensorwise", "mxfp8", "blockwise", "custom"},  # C: megatron/core/enums.py Fp8Recipe
    "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},  # E (values: C)
    "--attention-dropout": float, "--hidden-dropout": float,  # E
    "--num-distributed-optimizer-instances": int,  # C: DistributedDataParallelConfig (HSDP with Megatron-FSDP too)
    "--hierarchical-context-parallel-sizes": int,  # C: ModelParallelConfig.hierarchical_context_parallel_sizes
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},  # C: TransformerConfig.moe_token_dispatcher_type
    "--moe-flex-dispatcher-backend": {"deepep", "hybridep"},  # C: TransformerConfig.moe_flex_dispatcher_backend
    "--recompute-modules": {"core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "moe_act", "shared_experts"},  # C
    "--use-precision-aware-optimizer": None, "--exp-avg-dtype": {"fp32", "fp16", "bf16", "fp8"},  # C: OptimizerConfig
    "--exp-avg-sq-dtype": {"fp32", "fp16", "bf16", "fp8"},  # C: OptimizerConfig
    # C: TransformerConfig.fp4 / fp4_recipe and the fp4_param_gather switch, the fields Megatron-Bridge's
    # docs/training/mixed-precision.md ("NVFP4 Configuration Parameters", @067f987d) sets for NVFP4
    "--fp4-format": {"e2m1"}, "--fp4-recipe": {"nvfp4"}, "--fp4-param-gather": None,
    "--cuda-graph-impl": {"none", "local", "transformer_engine", "full_iteration"},  # C: cuda_graph_impl
    "--overlap-moe-expert-parallel-comm": None,  # C: TransformerConfig.overlap_moe_expert_parallel_comm
}
# torchtitan JobConfig sections and keys with their documented values
# (pytorch/torchtitan v0.2.2, torchtitan/config/job_config.py; schedules from torch.distributed.pipelining).
TORCHTITAN = {
    "model": {"name": str, "flavor": str, "converters": list},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int,
                 "mixed_precision_param": {"bfloat16", "float32"}, "mixed_precision_reduce": {"float32"}},
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": {"default", "always", "never"}, "tensor_parallel_degree": int,
                    "enable_async_tensor_parallel": bool, "pipeline_parallel_degree": int,
                    "pipeline_parallel_schedule": {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                                                   "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"},
                    "pipeline_parallel_microbatch_size": int, "module_fqns_per_model_part": list,
                    "context_parallel_degree": int, "context_parallel_rotate_method": {"allgather", "alltoall"},
                    "expert_parallel_degree": int, "expert_tensor_parallel_degree": int},
    "activation_checkpoint": {"mode": {"selective", "full", "memory_budget", "none"}, "selective_ac_option": str},
    "compile": {"enable": bool, "components": list},
}

# Megatron-Bridge (NeMo 2) ConfigContainer keys and documented values. Sources (NVIDIA-NeMo/Megatron-Bridge,
# commit 067f987d, docs/): M = megatron-lm-to-megatron-bridge.md (mapping table), N = nemo2-migration-guide.md
# (parallelism table), R = training/activation-recomputation.md, O = training/communication-overlap.md,
# X = training/mixed-precision.md, F = training/megatron-fsdp.md with src/megatron/bridge/training/config.py
# (dist./ddp.use_megatron_fsdp), Q = performance-guide.md (cp_comm_type, attention_backend, sharding strategy).
BRIDGE = {
    "model.tensor_model_parallel_size": int, "model.pipeline_model_parallel_size": int,  # M, N
    "model.virtual_pipeline_model_parallel_size": (int, type(None)), "model.context_parallel_size": int,  # N
    "model.expert_model_parallel_size": int, "model.expert_tensor_parallel_size": int,  # M, N
    "model.sequence_parallel": bool, "model.pipeline_model_parallel_layout": str,  # M, N
    "model.cp_comm_type": {"p2p", "all_gather", "a2a", "a2a+p2p"},  # Q
    "train.micro_batch_size": int, "train.global_batch_size": int,  # M
    "model.seq_length": int, "dataset.seq_length": int,  # M ("dual mapping")
    "ddp.use_distributed_optimizer": bool, "optimizer.use_distributed_optimizer": bool,  # M
    "dist.use_megatron_fsdp": bool, "ddp.use_megatron_fsdp": bool,  # F
    "ddp.data_parallel_sharding_strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},  # Q
    "checkpoint.ckpt_format": {"torch_dist", "zarr", "fsdp_dtensor"},  # M
    "ddp.overlap_grad_reduce": bool, "ddp.overlap_param_gather": bool,  # M
    "ddp.bucket_size": int,  # Q (DistributedDataParallelConfig.bucket_size, elements)
    "mixed_precision.fp8_param_gather": bool, "mixed_precision.fp4_param_gather": bool,  # X
    "model.recompute_granularity": {"full", "selective", None}, "model.recompute_method": {"uniform", "block"},  # R
    "model.recompute_num_layers": int,  # R
    "model.attention_backend": {"flash", "fused", "unfused", "local", "auto"},  # Q
    "comm_overlap.tp_comm_overlap": bool,  # O
    "model.attention_dropout": float, "model.hidden_dropout": float,  # M
    "mixed_precision": {"bf16_mixed", "fp16_mixed", "bf16_with_fp8_current_scaling_mixed",
                        "bf16_with_fp8_delayed_scaling_mixed", "bf16_with_mxfp8_mixed",
                        "bf16_with_nvfp4_mixed"},  # M, X ("NVFP4 Recipe Examples"), training/mixed_precision.py
    "ddp.num_distributed_optimizer_instances": int,  # F (HSDP across NVLink domains)
    "model.hierarchical_context_parallel_sizes": str,  # Q (a Hydra list, "[a2a,p2p]", with cp_comm_type a2a+p2p)
    # TransformerConfig fields the model provider exposes; the DeepSeek-V3 performance recipes set both
    "model.moe_token_dispatcher_type": {"allgather", "alltoall", "flex"},
    "model.moe_flex_dispatcher_backend": {"deepep", "hybridep"},
    "model.recompute_modules": str,  # R (a Hydra list of TransformerConfig.recompute_modules names)
    # OptimizerConfig fields (the DeepSeek-V3 and Qwen3 recipes set them: precision-aware optimizer)
    "optimizer.use_precision_aware_optimizer": bool, "optimizer.exp_avg_dtype": {"bf16", "fp32"},
    "optimizer.exp_avg_sq_dtype": {"bf16", "fp32"},
    # TransformerConfig.cuda_graph_impl (the Qwen3 and DeepSeek-V3 GB200 performance recipes set full_iteration)
    "model.cuda_graph_impl": {"none", "local", "transformer_engine", "full_iteration"},
    # CommOverlapConfig.overlap_moe_expert_parallel_comm and TransformerConfig.moe_shared_expert_overlap, which the
    # Qwen3 performance recipes set (scripts/performance/configs/qwen, perf_recipes/qwen/common.py)
    "comm_overlap.overlap_moe_expert_parallel_comm": bool, "model.moe_shared_expert_overlap": bool,
}


def _hydra(items: list[str]) -> dict[str, object]:
    """key=value items as Hydra reads them: null, true/false, numbers, quoted or bare strings."""
    out: dict[str, object] = {}
    for item in items:
        key, _, raw = item.partition("=")
        words = {"null": None, "true": True, "false": False}
        if raw in words:
            out[key] = words[raw]
        elif re.fullmatch(r"-?\d+", raw):
            out[key] = int(raw)
        elif re.fullmatch(r"-?\d+\.\d*", raw):
            out[key] = float(raw)
        else:
            out[key] = raw.strip('"')
    return out


PLANS = [  # (model, --set, plan, gpus): every branch of both exporters
    ("llama3-70b", [], "tp=8 pp=4 mbs=1 gbs=1024 zero=1 sp=on recompute=selective", 1024),
    ("llama3-70b", ["layers=10"], "tp=4 pp=4 mbs=2 gbs=256 zero=0 recompute=full", 256),
    ("llama3-8b", [], "tp=2 pp=2 vpp=4 schedule=interleaved cp=2 mbs=1 gbs=64 zero=2 dtype=fp8", 64),
    ("mixtral-8x7b", [], "tp=2 pp=1 ep=8 mbs=1 gbs=128 zero=3 dtype=bf16", 64),
    ("gpt3-175b", [], "tp=8 pp=8 mbs=1 gbs=512 zero=1 recompute=full dtype=fp16 tp_overlap=off", 512),
    ("llama2-7b", [], "tp=1 pp=1 mbs=4 gbs=32 dtype=fp32 zero=1", 8),
    ("llama3-70b", [], "tp=4 pp=4 mbs=1 gbs=64 zero=1 dtype=nvfp4", 64),
    ("llama3-8b", [], "tp=2 pp=1 mbs=1 gbs=64 zero=3 dp_shard=4", 64),  # HSDP: 8 copies of 4-way shards
    ("llama3-8b", [], "tp=2 pp=1 cp=8 mbs=1 gbs=8 zero=1 cp_comm=a2a+p2p cp_a2a=4", 64),  # hierarchical CP
    ("mixtral-8x7b", [], "tp=1 pp=1 ep=32 mbs=1 gbs=64 zero=1 dispatcher=flex adam_moments=bf16", 64),  # DeepEP
    ("mixtral-8x7b", [], "tp=2 ep=8 mbs=1 gbs=64 zero=1 recompute=selective recompute_modules=moe_act+layernorm", 64),
    ("mixtral-8x7b", [], "tp=1 ep=8 mbs=1 gbs=64 zero=1 dispatcher=flex ep_overlap=on cuda_graphs=on", 64),
    ("llama3-8b", [], "tp=2 pp=1 mbs=1 gbs=64 zero=1 dtype=fp8 fp8_params=off bucket_mb=75", 64),  # NeMo 1 style
]


def _plan(model: str, sets: list[str], text: str, gpus: int, framework: str):
    return load_model(model, sets), Plan.parse(text, gpus=gpus, framework=load_profile(framework))


def _flags(args: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, token in enumerate(args):
        if token.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[token] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def _layout_counts(layout: str) -> list[str]:
    """Megatron's documented grammar: commas are cosmetic, x*n repeats x, '|' splits chunks."""
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout.strip('"').replace(",", ""))
    return text.split("|")


@pytest.mark.parametrize("model,sets,text,gpus", PLANS)
def test_megatron_flags_are_documented_and_rebuild_the_plan(model, sets, text, gpus):
    spec, plan = _plan(model, sets, text, gpus, "megatron-core")
    flags = _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    for flag, value in flags.items():
        assert flag in MEGATRON, f"{flag} is not a documented Megatron-LM flag"
        kind = MEGATRON[flag]
        if kind is None:
            assert value is None, flag
        elif isinstance(kind, set):
            assert value in kind, (flag, value)
        else:
            kind(value)  # parses as the documented type
    tp, pp, cp = (int(flags[f"--{n}-parallel-size"]) for n in ("tensor-model", "pipeline-model", "context"))
    dp = gpus // (tp * pp * cp)  # Megatron derives the data-parallel size from the world size
    assert tp * pp * cp * dp == gpus and dp == plan.dp
    assert int(flags["--global-batch-size"]) // (int(flags["--micro-batch-size"]) * dp) == plan.microbatches
    assert ("--sequence-parallel" in flags) == bool(plan.sp)


def test_megatron_layout_string_places_layers_as_simulated():
    assert pipeline_layout([2, 3, 3, 2]) == "E,t*2|t*3|t*3|t*2,L"
    spec, plan = _plan("llama3-70b", ["layers=10"], "tp=4 pp=4 mbs=2 gbs=256", 256, "megatron-core")
    flags = _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    chunks = _layout_counts(flags["--pipeline-model-parallel-layout"])
    # 10 layers on 4 stages: 2 each, the remaining 2 on the middle stages
    assert chunks == ["E" + "t" * 2, "t" * 3, "t" * 3, "t" * 2 + "L"]
    even, plan = _plan("llama3-8b", [], "tp=2 pp=2 vpp=4 schedule=interleaved mbs=1 gbs=64", 64, "megatron-core")
    flags = _flags(list(launch_settings("megatron", even, plan).settings["args"]))
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "4"  # 32 layers / (2 stages x 4 chunks)


def test_weight_precision_and_buckets_export_as_simulated():
    """FP8 weights gathered in FP8 (the profile's default) export --fp8-param-gather, BF16 weights do not; a
    plan's bucket_mb of bf16 gradients is 75 MiB / 2 bytes = 39,321,600 parameters a bucket."""
    spec, plan = _plan("llama3-8b", [], "tp=2 mbs=1 gbs=64 zero=1 dtype=fp8", 64, "megatron-core")
    assert plan.fp8_params and plan.weight_bytes == 1
    assert "--fp8-param-gather" in _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    spec, plan = _plan("llama3-8b", [], "tp=2 mbs=1 gbs=64 zero=1 dtype=fp8 fp8_params=off bucket_mb=75", 64,
                       "megatron-core")
    assert plan.weight_bytes == 2
    flags = _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    assert "--fp8-param-gather" not in flags and flags["--ddp-bucket-size"] == str(75 * 2**20 // 2)
    items = _hydra(list(launch_settings("megatron-bridge", spec, plan).settings["overrides"]))
    assert items["mixed_precision.fp8_param_gather"] is False and items["ddp.bucket_size"] == 75 * 2**20 // 2
    nvfp4 = "tp=4 pp=4 mbs=1 gbs=64 zero=1 dtype=nvfp4 fp8_params=off"
    spec, plan = _plan("llama3-70b", [], nvfp4, 64, "megatron-core")
    assert "--fp4-param-gather" not in _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    items = _hydra(list(launch_settings("megatron-bridge", spec, plan).settings["overrides"]))
    assert items["mixed_precision.fp4_param_gather"] is False


def test_megatron_execution_options_follow_the_profile():
    spec, plan = _plan("llama3-70b", [], "tp=8 pp=4 mbs=1 gbs=1024", 1024, "megatron-core")
    flags = _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    assert {"--tp-comm-overlap", "--overlap-grad-reduce", "--use-distributed-optimizer", "--sequence-parallel"} <= set(flags)
    assert flags["--attention-dropout"] == "0.0" and flags["--attention-backend"] == "fused"
    spec, plan = _plan("gpt3-175b", [], "tp=8 pp=8 mbs=1 gbs=512", 512, "megatron-lm-2021")
    flags = _flags(list(launch_settings("megatron", spec, plan).settings["args"]))
    assert flags["--attention-backend"] == "unfused" and "--attention-dropout" not in flags  # GPT-3 keeps dropout
    assert "--tp-comm-overlap" not in flags and "--sequence-parallel" not in flags


@pytest.mark.parametrize("model,sets,text,gpus", [p for p in PLANS if "zero=1" not in p[2] and "fp16" not in p[2]])
def test_torchtitan_keys_are_documented_and_rebuild_the_plan(model, sets, text, gpus):
    spec, plan = _plan(model, sets, text, gpus, "torchtitan")
    tomllib = pytest.importorskip("tomllib", reason="reading TOML back needs Python 3.11")
    out = launch_settings("torchtitan", spec, plan)
    config = tomllib.loads(out.text)
    assert config == out.settings
    for section, keys in config.items():
        assert section in TORCHTITAN, section
        for key, value in keys.items():
            kind = TORCHTITAN[section].get(key)
            assert kind is not None, f"[{section}] {key} is not a documented torchtitan key"
            assert value in kind if isinstance(kind, set) else isinstance(value, kind), (section, key, value)
    par, train = config["parallelism"], config["training"]
    degrees = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "context_parallel_degree",
               "tensor_parallel_degree", "pipeline_parallel_degree")
    world = 1
    for key in degrees:
        world *= par[key]
    assert world == gpus
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    per_rank = train["local_batch_size"] if plan.pp > 1 else train["local_batch_size"] * plan.microbatches
    assert per_rank * dp == train["global_batch_size"] == plan.gbs
    assert (par["data_parallel_shard_degree"] > 1) == (plan.zero >= 2 and plan.dp > 1)


def test_torchtitan_pipeline_parts_hold_the_simulated_layers():
    spec, plan = _plan("llama3-70b", ["layers=10"], "tp=4 pp=4 mbs=2 gbs=256 zero=3", 256, "torchtitan")
    parts = launch_settings("torchtitan", spec, plan).settings["parallelism"]["module_fqns_per_model_part"]
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [2, 3, 3, 2]
    assert [m for p in parts for m in p] == ["tok_embeddings", *[f"layers.{i}" for i in range(10)], "norm", "output"]


@pytest.mark.parametrize("model,sets,text,gpus", [p for p in PLANS if "fp32" not in p[2]])
def test_bridge_keys_are_documented_and_every_choice_is_written(model, sets, text, gpus):
    spec, plan = _plan(model, sets, text, gpus, "megatron-core")
    items = _hydra(list(launch_settings("megatron-bridge", spec, plan).settings["overrides"]))
    for key, value in items.items():
        kind = BRIDGE.get(key)
        assert kind is not None, f"{key} is not a documented Megatron-Bridge field"
        assert value in kind if isinstance(kind, set) else isinstance(value, kind), (key, value)
    tp, pp, cp = (items[f"model.{n}_parallel_size"] for n in ("tensor_model", "pipeline_model", "context"))
    assert gpus // (tp * pp * cp) == plan.dp
    assert items["train.global_batch_size"] // (items["train.micro_batch_size"] * plan.dp) == plan.microbatches
    # a recipe has its own defaults, so the choices that are off are written too
    assert items["model.sequence_parallel"] is bool(plan.sp)
    assert items["ddp.use_distributed_optimizer"] is (plan.zero == 1)
    assert items["dist.use_megatron_fsdp"] is (plan.zero >= 2)
    assert items["model.cuda_graph_impl"] == ("full_iteration" if plan.cuda_graphs else "none")


def test_bridge_layout_matches_megatron():
    spec, plan = _plan("llama3-70b", ["layers=10"], "tp=4 pp=4 mbs=2 gbs=256", 256, "megatron-core")
    items = _hydra(list(launch_settings("megatron-bridge", spec, plan).settings["overrides"]))
    assert _layout_counts(items["model.pipeline_model_parallel_layout"]) == ["Ett", "ttt", "ttt", "ttL"]


def test_settings_a_framework_cannot_express_are_refused():
    spec, plan = _plan("llama3-8b", [], "tp=2 mbs=1 gbs=8 zero=1", 8, "torchtitan")
    with pytest.raises(ConfigError, match="no ZeRO-1"):
        launch_settings("torchtitan", spec, plan)
    spec, plan = _plan("llama3-8b", [], "tp=2 pp=2 mbs=1 gbs=8 schedule=gpipe", 8, "torchtitan")
    with pytest.raises(ConfigError, match="GPipe"):
        launch_settings("megatron", spec, plan)
    spec, plan = _plan("llama3-8b", [], "tp=2 mbs=1 gbs=8 zero=3 cuda_graphs=on", 8, "torchtitan")
    with pytest.raises(ConfigError, match="CUDA graphs"):
        launch_settings("torchtitan", spec, plan)


def _best_json(tmp_path, plan: str, gpus: int, space: str = "default"):
    run = tmp_path / "runs" / "study"
    run.mkdir(parents=True)
    (run / "best.json").write_text(json.dumps({"space": space, "best": [{"plan": plan, "gpus": gpus}]}))
    return run


def test_cli_exports_a_study_best_plan(tmp_path, capsys):
    run = _best_json(tmp_path, "tp=8 pp=1 dp=128 mbs=1 gbs=1024 zero=1 recompute=selective sp=on "
                               "framework=megatron-core", 1024)
    assert main(["export", str(run)]) == 0
    out = capsys.readouterr().out
    assert "--tensor-model-parallel-size 8 \\" in out and "--seq-length 8192" in out  # the default space's model
    assert main(["export", str(run), "--json", "--out", str(tmp_path / "args.txt")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == "megatron" and doc["gpus"] == 1024
    args_file = (tmp_path / "args.txt").read_text().replace("\\\n", " ").split()
    assert args_file == doc["settings"]["args"]


def test_cli_bad_inputs_are_one_line_errors(tmp_path, capsys):
    run = _best_json(tmp_path, "tp=8 mbs=1 gbs=1024 zero=1 framework=megatron-core", 1024)
    cases = [(["export", str(run), "--to", "torchtitan"], "simulated on framework=megatron-core"),
             (["export", str(tmp_path / "nope")], "not found"),
             (["export", str(run), "--rank", "3"], "has 1 plan(s)"),
             (["export", "--plan", "tp=8"], "needs --model"),
             (["export", "--model", "llama3-8b", "--plan", "tp=3", "--gpus", "8"], "tp*cp*pp")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)


def test_torchtitan_reduces_in_float32_and_says_so_when_the_plan_did_not():
    spec, plan = _plan("llama3-8b", [], "tp=1 pp=1 mbs=1 gbs=64 zero=3", 64, "torchtitan")
    settings = launch_settings("torchtitan", spec, plan)
    assert settings.settings["training"]["mixed_precision_reduce"] == "float32" and plan.grad_dtype == "fp32"
    assert not any("grad_dtype" in n for n in settings.notes)
    spec, bf16 = _plan("llama3-8b", [], "tp=1 pp=1 mbs=1 gbs=64 zero=3 grad_dtype=bf16", 64, "torchtitan")
    assert any("grad_dtype=bf16" in n for n in launch_settings("torchtitan", spec, bf16).notes)
