"""Framework profiles: shipped profiles load, set the plan's defaults, and plan knobs override them."""

import pytest

from stageopt.cli import main
from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.frameworks import DEFAULT_FRAMEWORK, list_profiles, load_profile
from stageopt.graph.block import arch_of
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload


def test_shipped_profiles_load_and_the_default_is_megatron_core():
    assert {"megatron-core", "megatron-lm-2021", "megatron-deepspeed", "torchtitan"} <= set(list_profiles())
    assert DEFAULT_FRAMEWORK == "megatron-core"
    assert Plan.parse("tp=2").framework.name == "megatron-core"


def test_profile_defaults_fill_the_plan():
    core = Plan.parse("tp=8 pp=2 dp=4 gbs=4")
    assert (core.sp, core.zero, core.tp_overlap, core.dp_overlap) == (True, 1, True, True)
    old = Plan.parse("tp=8 pp=2 dp=4 gbs=4", framework=load_profile("megatron-lm-2021"))
    assert (old.sp, old.zero, old.tp_overlap, old.dp_overlap) == (False, 0, False, False)
    titan = Plan.parse("tp=2 dp=4 gbs=4 framework=torchtitan")
    assert (titan.sp, titan.zero) == (True, 3)


def test_plan_knobs_override_the_profile():
    plan = Plan.parse("tp=8 dp=4 gbs=4 sp=off zero=0 tp_overlap=off dp_overlap=off")
    assert (plan.sp, plan.zero, plan.tp_overlap, plan.dp_overlap) == (False, 0, False, False)


def test_defaults_that_need_a_degree_stay_off_without_it():
    plan = Plan.parse("tp=1 dp=1")
    assert (plan.sp, plan.zero, plan.tp_overlap) == (False, 0, False)


def test_profile_decides_attention_kernel_and_dropout():
    gpt = load_model("gpt3-175b")  # the model recipe has dropout
    arch_2021 = arch_of(gpt, Plan.parse("tp=1", framework=load_profile("megatron-lm-2021")))
    arch_titan = arch_of(gpt, Plan.parse("tp=1", framework=load_profile("torchtitan")))
    arch_core = arch_of(gpt, Plan.parse("tp=1"))
    assert (arch_2021.attention, arch_2021.dropout) == ("eager", True)
    assert (arch_titan.attention, arch_titan.dropout) == ("flash", False)
    assert (arch_core.attention, arch_core.dropout) == ("flash", True)  # dropout: the model recipe's


def test_unsupported_schedule_names_the_framework():
    model = load_model("llama3-8b")
    with pytest.raises(InfeasiblePlan, match="schedule=gpipe is not implemented by framework megatron-core"):
        build_workload(model, Plan.parse("pp=2 gbs=4 schedule=gpipe"), 2)
    build_workload(model, Plan.parse("pp=2 gbs=4 schedule=gpipe framework=torchtitan"), 2)


def test_conflicting_framework_names_are_refused():
    with pytest.raises(InfeasiblePlan, match="give one"):
        Plan.parse("tp=2 framework=torchtitan", framework=load_profile("megatron-core"))


def test_unknown_profile_suggests_a_name():
    with pytest.raises(ConfigError, match="did you mean 'torchtitan'"):
        load_profile("torchtitn")


def test_custom_profile_file(tmp_path):
    path = tmp_path / "mystack.yaml"
    path.write_text("name: mystack\nattention: eager\nsequence_parallel: false\nschedules: [1f1b]\n")
    plan = Plan.parse("tp=4 dp=2", framework=load_profile(str(path)))
    assert plan.framework.name == "mystack" and plan.sp is False and plan.zero == 1
    path.write_text("name: mystack\nattenton: eager\n")
    with pytest.raises(ConfigError, match="did you mean 'attention'"):
        load_profile(str(path))
    path.write_text("name: mystack\nschedules: [zb]\n")
    with pytest.raises(ConfigError, match="schedules"):
        load_profile(str(path))


def test_a_profile_sets_only_what_differs_from_its_base(tmp_path):
    core = load_profile("megatron-core")
    path = tmp_path / "ours.yaml"
    path.write_text("base: megatron-core\nname: ours\ndropout: true\n")
    ours = load_profile(str(path))
    assert (ours.name, ours.dropout) == ("ours", True) and core.dropout is not True
    assert (ours.fusions, ours.schedules, ours.low_precision) == (core.fusions, core.schedules, core.low_precision)
    (tmp_path / "child.yaml").write_text("base: ours.yaml\nname: child\nattention: eager\n")  # relative to the file
    child = load_profile(str(tmp_path / "child.yaml"))
    assert (child.dropout, child.attention, child.fusions) == (True, "eager", core.fusions)


def test_a_base_that_loops_or_is_unknown_is_one_line_naming_base(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nname: b\n")
    with pytest.raises(ConfigError, match="'base' runs in a circle") as info:
        load_profile(str(tmp_path / "a.yaml"))
    assert "\n" not in str(info.value)
    (tmp_path / "c.yaml").write_text("base: megatron-cor\nname: c\n")
    with pytest.raises(ConfigError, match="did you mean 'megatron-core'"):
        load_profile(str(tmp_path / "c.yaml"))


def test_torchtitan_of_2024_25_differs_from_todays_only_in_its_attention_kernel():
    """torchtitan asks SDPA for cuDNN first since 2025-10 (#1776); before, FlashAttention-2 came first on Hopper."""
    import dataclasses
    for today, dated in (("torchtitan", "torchtitan-2025"), ("torchtitan-compile", "torchtitan-compile-2025")):
        now, then = load_profile(today), load_profile(dated)
        differ = {f.name for f in dataclasses.fields(now) if getattr(now, f.name) != getattr(then, f.name)}
        assert differ == {"name", "description", "source", "attention_kernel"}
        assert (now.attention_kernel, then.attention_kernel) == ("best", "fa2")


def test_megascale_is_its_megatron_lm_base_with_the_papers_changes():
    """MegaScale (arXiv 2402.15627 sec. 3.2-3.3) on Megatron-LM 285068c8: SP with TP overlapped, ZeRO-2 overlapped
    chunk by chunk, FlashAttention-2; everything else as the 2022 Megatron-LM it forked."""
    import dataclasses
    base, ours = load_profile("megatron-lm-2022"), load_profile("megascale")
    differ = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(base, f.name)}
    assert differ == {"name", "description", "source", "attention", "attention_kernel", "sequence_parallel",
                      "tp_comm_overlap", "dp_comm_overlap", "distributed_optimizer", "dp_bucket", "nccl_release"}
    assert (ours.attention, ours.attention_kernel, ours.dp_bucket) == ("flash", "fa2", "chunk")
    assert (base.nccl_release, ours.nccl_release) == ("2.8", "2.18")  # a 2021 container, a 2023 one
    assert ours.pipeline_scatter_gather and ours.tp_async_backward  # the base's, kept


def test_megatron_lm_2024_is_megatron_core_with_the_scripts_gradient_and_loss_defaults():
    """Megatron-LM's pretrain_gpt.py at core_r0.8.0 forces fp32 gradient reduction for bf16 and leaves
    --cross-entropy-loss-fusion and --fp8-param-gather off; all else is the Megatron-Core the default profile runs."""
    import dataclasses
    base, ours = load_profile("megatron-core"), load_profile("megatron-lm-2024")
    differ = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(base, f.name)}
    assert differ == {"name", "description", "source", "grad_reduce_dtype", "cross_entropy", "fusions",
                      "attention_kernel", "fp8_params"}
    assert set(base.fusions) - set(ours.fusions) == {"cross_entropy"}
    assert base.fp8_params and not ours.fp8_params
    assert ours.default_grad_dtype("bf16") == "fp32" and base.default_grad_dtype("bf16") == "bf16"
    assert (base.attention_kernel, ours.attention_kernel) == ("best", "cudnn-2024")


def test_nemo_2024_is_megatron_core_with_megatron_cores_native_fused_loss():
    """NeMo of September 2024 to mid-2025 ran Megatron-Core's own fused cross-entropy (three compiled kernels on
    an fp32 copy), not Transformer Engine's single kernel; gradients in bf16 as today."""
    import dataclasses
    base, ours = load_profile("megatron-core"), load_profile("nemo-2024")
    differ = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(base, f.name)}
    assert differ == {"name", "description", "source", "cross_entropy", "fusions", "attention_kernel"}
    assert set(base.fusions) - set(ours.fusions) == {"cross_entropy"}
    assert (base.cross_entropy, ours.cross_entropy) == ("te_fused", "native_fused")
    assert ours.attention_kernel == "cudnn-2024"


def test_megatron_lm_2025_is_megatron_core_with_the_native_fused_loss():
    """Megatron-LM's Llama example script of June 2025 passes --cross-entropy-loss-fusion, whose implementation
    defaults to Megatron-Core's native one, and --grad-reduce-in-bf16: megatron-core but for the loss."""
    import dataclasses
    base, ours = load_profile("megatron-core"), load_profile("megatron-lm-2025")
    differ = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(base, f.name)}
    assert differ == {"name", "description", "source", "cross_entropy", "fusions"}
    assert set(base.fusions) - set(ours.fusions) == {"cross_entropy"}
    assert ours.cross_entropy == "native_fused" and ours.default_grad_dtype("bf16") == "bf16"


def test_nemo_2_runs_squared_relu_eagerly_and_nemo_1s_configs_without_loss_fusion_run_the_unfused_loss():
    """NeMo 2's Nemotron activation is uncompiled PyTorch (NeMo 1's and Megatron-Core's are compiled); the NeMo 1
    configs that leave cross_entropy_loss_fusion off run Megatron's vocab-parallel loss kernel by kernel, with the
    bf16 gradients of the rest of nemo-2024."""
    import dataclasses
    nemo1, nemo2, unfused = (load_profile(n) for n in ("nemo-2024", "nemo2-2025", "nemo-2024-unfused-ce"))
    differ = {f.name for f in dataclasses.fields(nemo2) if getattr(nemo2, f.name) != getattr(nemo1, f.name)}
    assert differ == {"name", "description", "source", "fusions", "attention_kernel"}
    assert (nemo1.attention_kernel, nemo2.attention_kernel) == ("cudnn-2024", "best")
    assert set(nemo1.fusions) - set(nemo2.fusions) == {"squared_relu"}
    differ = {f.name for f in dataclasses.fields(unfused) if getattr(unfused, f.name) != getattr(nemo1, f.name)}
    assert differ == {"name", "description", "source", "cross_entropy"}
    assert unfused.cross_entropy == "in_place" and unfused.default_grad_dtype("bf16") == "bf16"
    assert all("squared_relu" in load_profile(n).fusions for n in ("megatron-core", "megatron-lm-2024"))


def test_zero_bubble_is_its_megatron_lm_base_with_the_forks_launch_flags():
    """The zero-bubble fork as the paper ran it: --sequence-parallel, --use-distributed-optimizer and
    --enable-optimizer-post-validation on the legacy Megatron-LM model with eager attention (the paper's measured
    memory), and its ZB-H1 / ZB-2p / ZB-V schedules beside 1F1B and interleaving, those three on the fork's own
    runtime (sends before a W pass not waited for)."""
    import dataclasses
    base, ours = load_profile("megatron-lm-2022"), load_profile("zero-bubble")
    differ = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(base, f.name)}
    assert differ == {"name", "description", "source", "sequence_parallel", "distributed_optimizer", "schedules",
                      "optimizer_post_validation", "nccl_release", "async_p2p_schedules"}
    assert ours.attention == "eager" and ours.optimizer_post_validation
    assert set(ours.async_p2p_schedules) == {"zbh1", "zb2p", "zbv"}
    assert set(ours.schedules) == {"1f1b", "interleaved", "zbh1", "zb2p", "zbv"}


def test_nemo_automodel_profiles_are_their_torchtitan_bases_with_the_recipes_choices():
    """AutoModel's dense path is torchtitan-compile-2025 but for FSDP2Manager's bf16 reduction; its MoE path is eager
    torchtitan with Transformer Engine's attention and RMSNorm, a compiled SwiGLU, grouped-GEMM experts behind DeepEP
    and the MoE parallelizer's fp32 reduction (NVIDIA-NeMo/Automodel @2013a4dd6 and @8d9bfb90e)."""
    import dataclasses

    def differ(name, base):
        ours, theirs = load_profile(name), load_profile(base)
        return {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(theirs, f.name)}

    assert differ("nemo-automodel", "torchtitan-compile-2025") == {"name", "description", "source", "grad_reduce_dtype",
                                                                  "master_weights"}
    assert load_profile("nemo-automodel").default_grad_dtype("bf16") == "bf16"
    assert differ("nemo-automodel-te", "torchtitan") == {"name", "description", "source", "fusions", "moe_dispatcher",
                                                         "master_weights", "expert_bias"}
    te = load_profile("nemo-automodel-te")
    assert set(te.fusions) == {"norm", "bias_activation", "activation_clamp", "expert_fc1"}
    assert te.default_grad_dtype("bf16") == "fp32"
    assert (te.attention_kernel, te.expert_gemms, te.expert_bias) == ("best", "grouped", "eager")
    assert Plan.parse("dp=8 ep=8 gbs=8", framework=te).dispatcher == "flex"
    assert differ("nemo-automodel-te-flex", "nemo-automodel-te") == {"name", "description", "source",
                                                                      "attention_kernel"}
    assert load_profile("nemo-automodel-te-flex").attention_kernel == "flex"


def test_outputs_name_the_profile(capsys):
    assert main(["simulate", "--model", "llama3-8b", "--gpus", "8", "--plan", "tp=2 mbs=1 gbs=8",
                 "--framework", "torchtitan", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"framework": "torchtitan"' in out and "zero=3" in out
    assert main(["presets"]) == 0
    table = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "megatron-lm-2021" in table
    # the attention each profile prices, as the kernel model reads attention / attention_kernel
    assert "eager" in table["megatron-lm-2021"] and "cuDNN 2024" in table["nemo-2024"]
    assert "cuDNN today" in table["megatron-core"] and "FlashAttention-2" in table["torchtitan-2025"]
    # FP8 weights: gathered in FP8 by NeMo 2 / Megatron-Bridge, kept BF16 by torchtitan and Megatron-LM's default
    assert "bf16 weights" in table["torchtitan"] and "bf16 weights" in table["megatron-lm-2024"]
    assert "bf16 weights" not in table["megatron-core"]


def test_bad_framework_on_the_cli_is_one_line_exit_2(capsys):
    assert main(["inspect", "--model", "llama3-8b", "--plan", "tp=2", "--framework", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown framework 'nope'" in err


def test_torchtitan_selective_reruns_every_second_matmul_and_the_elementwise_ops():
    """torchtitan's op-level selective checkpointing: of a Llama layer's 7 matmuls (q k v o, w1 w3 w2)
    the 2nd, 4th and 6th are recomputed; Megatron's selective re-runs the flash attention kernel alone
    (Megatron-Core checkpoints core attention whatever its backend): 4 s^2 h model FLOPs a layer."""
    from stageopt.workload.stats import stage_stats
    m = load_model("llama3-8b", ["layers=2"])
    h, s, ffn, kv = m.hidden, m.seq, m.ffn, m.kv_heads * (m.hidden // m.heads)
    plan = Plan.parse("tp=1 pp=1 dp=1 mbs=1 gbs=1 recompute=selective")
    titan = stage_stats(build_workload(m, plan.replace(framework=load_profile("torchtitan"))), 0)
    per_layer = 2 * s * (h * kv + h * h + h * ffn)  # k, o and w3 forward again
    assert titan.flops["recompute"] == pytest.approx(2 * per_layer, rel=1e-9)
    megatron = stage_stats(build_workload(m, plan.replace(framework=load_profile("megatron-core"))), 0)
    assert megatron.flops["recompute"] == pytest.approx(2 * 4 * s * s * h, rel=1e-9)


def test_context_parallel_exchange_defaults_to_the_stacks():
    """Megatron-LM's --cp-comm-type defaults to p2p; torchtitan's context_parallel_rotate_method to allgather."""
    assert Plan.parse("cp=2 dp=4 gbs=8").cp_comm == "p2p"
    assert Plan.parse("cp=2 dp=4 gbs=8 framework=torchtitan").cp_comm == "all_gather"
    assert Plan.parse("cp=2 dp=4 gbs=8 cp_comm=all_gather").cp_comm == "all_gather"
    assert Plan.parse("cp=1 dp=4 gbs=4").cp_comm == "all_gather"  # nothing to exchange


def test_megatron_lm_2020_sends_whole_activations_and_has_no_interleaving():
    """January 2021 Megatron-LM (before PTD-P): a stage sends its whole s x b x h fp16 activation forward and
    its gradient backward, once per micro-batch each; the 2021 stack sends 1/tp of it (scatter/gather)."""
    from stageopt.workload.stats import stage_stats

    model = load_model("gpt3-175b", ["layers=8"])
    sent = {}
    for name in ("megatron-lm-2020", "megatron-lm-2021"):
        plan = Plan.parse("tp=8 pp=2 dp=1 mbs=1 gbs=4 recompute=full dtype=fp16", framework=load_profile(name))
        sent[name] = stage_stats(build_workload(model, plan, 16), 0).p2p_bytes
    whole = model.seq * 1 * model.hidden * 2
    assert sent["megatron-lm-2020"] == 4 * whole  # 4 micro-batches' activations out, no gradient sent back
    assert sent["megatron-lm-2021"] == sent["megatron-lm-2020"] / 8
    with pytest.raises(InfeasiblePlan, match="schedule=interleaved is not implemented by framework megatron-lm-2020"):
        build_workload(model, Plan.parse("tp=8 pp=2 vpp=2 gbs=4 schedule=interleaved framework=megatron-lm-2020"), 16)
