"""The cost model's terms against hand derivations: fusion, eager kernels, TP overlap, buckets, scatter-gather."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stageopt.frameworks import load_profile
from stageopt.graph.block import arch_of, build_block
from stageopt.graph.symbols import ALL_SYMBOLS
from stageopt.hardware import load_hardware
from stageopt.hardware.network import collective_time, exposed_under_gemm
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical_tail import bucketed_time
from stageopt.workload import build_workload

SMALL = ["layers=2", "hidden=256", "heads=4", "kv_heads=4", "ffn=1024", "vocab=1024", "seq=128"]


def _block(model: str, sets: list[str], plan: str, framework, kind: str = "dense"):
    spec = load_model(model, sets)
    stack = load_profile(framework) if isinstance(framework, str) else framework
    p = Plan.parse(plan, gpus=None, framework=stack)
    return spec, build_block(kind, arch_of(spec, p), p.recompute)


def _values(**named):
    return {sym: named[sym.name] for sym in ALL_SYMBOLS if sym.name in named}


def _subs(expr, s: int, h: int) -> int:
    return int(expr.subs(_values(B=1, S=s, H=h, tp=1, cp=1, ep=1)))


def test_fused_bias_dropout_add_moves_only_outside_tensors():
    """proj bias + dropout + residual as one kernel: read proj out, bias, x; write out and the mask.

    bf16 activations (2 B), 1-byte dropout mask: 2sh + 2h + 2sh (reads) + 2sh + sh (writes) = 7sh + 2h.
    Unfused they move (2sh+2h + 2sh) + (2sh + 2sh+sh) + (4sh + 2sh) = 15sh + 2h.
    """
    sets = [*SMALL, "dropout=true"]
    _, fused = _block("gpt3-175b", sets, "tp=1 mbs=1 gbs=1", "megatron-lm-2021")
    op = next(o for o in fused.fwd if o.name == "proj.bias_add+proj_dropout+attn_residual")
    s, h = 128, 256
    assert _subs(op.kernel_bytes, s, h) == 7 * s * h + 2 * h
    unfused = dataclasses.replace(load_profile("megatron-lm-2021"), fusions=())
    _, eager = _block("gpt3-175b", sets, "tp=1 mbs=1 gbs=1", unfused)
    parts = [o for o in eager.fwd if o.name in ("proj.bias_add", "proj_dropout", "attn_residual")]
    assert sum(_subs(o.kernel_bytes, s, h) for o in parts) == 15 * s * h + 2 * h
    assert len(parts) == 3 and op.launches == 1


def test_eager_rmsnorm_is_three_passes_and_three_launches():
    _, fused = _block("llama3-8b", SMALL, "tp=1 mbs=1 gbs=1", "megatron-core")
    _, eager = _block("llama3-8b", SMALL, "tp=1 mbs=1 gbs=1", "torchtitan")
    one = next(o for o in fused.fwd if o.name == "ln1")
    three = next(o for o in eager.fwd if o.name == "ln1")
    assert _subs(three.kernel_bytes, 128, 256) == 3 * _subs(one.kernel_bytes, 128, 256)
    assert (one.launches, three.launches) == (1, 3)


def test_tp_overlap_hides_all_but_one_gemm_chunk():
    # 10 ms of all-gather pipelined with 8 ms of GEMM over 4 chunks: 3/4 x 8 = 6 ms hides, 4 ms stays.
    assert exposed_under_gemm(10e-3, 8e-3, 4) == pytest.approx(4e-3)
    assert exposed_under_gemm(1e-3, 8e-3, 4) == 0.0


def test_tp_overlap_pairs_gather_with_its_consumers_and_scatter_with_its_producer():
    _, g = _block("llama3-8b", SMALL, "tp=2 mbs=1 gbs=1 sp=on", "megatron-core")
    from stageopt.graph.overlap import overlap_partners
    ops = g.fwd
    pairs = {ops[i].name: {ops[j].name for j in js} for i, js in overlap_partners(ops).items()}
    gathers = [names for n, names in pairs.items() if n.startswith("all_gather")]
    assert {"q", "k", "v"} in gathers and {"mlp.gate", "mlp.up"} in gathers
    scatters = [names for n, names in pairs.items() if n.startswith("reduce_scatter")]
    assert {"proj"} in scatters and {"mlp.down"} in scatters


def test_buckets_each_pay_the_collective_latency():
    hw = load_hardware("h100-sxm")
    params, bucket = 1e9, 4e7  # 25 buckets of 4e7 fp32 gradients over 64 ranks, one per node
    want = 25 * collective_time(hw, "reduce_scatter", 4e7 * 4, 64, 8)
    assert bucketed_time(hw, "reduce_scatter", params, 4, 64, 8, bucket) == pytest.approx(want)
    assert bucketed_time(hw, "reduce_scatter", 0.0, 4, 64, 8, bucket) == 0.0
    assert bucketed_time(hw, "all_gather", 1e6, 2, 64, 8, None, 10) == pytest.approx(
        10 * collective_time(hw, "all_gather", 2e5, 64, 8))


def test_megatron_core_buckets_grow_with_data_parallel_size():
    stack = load_profile("megatron-core")
    assert stack.grad_bucket(8) == pytest.approx(4e7)
    assert stack.grad_bucket(320) == pytest.approx(3.2e8)  # max(4e7, 1e6 x dp)


def test_scatter_gather_sends_one_tp_shard_of_the_activation():
    spec = load_model("gpt3-175b", ["layers=8"])
    for framework, divide in (("megatron-lm-2021", 8), ("megatron-deepspeed", 1)):
        plan = Plan.parse("tp=8 pp=2 mbs=1 gbs=8 sp=off", gpus=16, framework=load_profile(framework))
        work = build_workload(spec, plan, 16)
        chunk = work.chunks[0][0]
        whole = work.value("dense", "boundary_bytes")
        assert whole == 2 * spec.seq * spec.hidden  # b=1, bf16 activation of s x h
        assert work.message_bytes(chunk) == whole / divide


def test_expert_capacity_scales_routed_work_only():
    sets = ["layers=2", "expert_capacity=1.25"]
    base, cap = (_block("mixtral-8x7b", s, "tp=1 mbs=1 gbs=1", "megatron-core", "moe")[1]
                 for s in (["layers=2"], sets))
    values = _values(B=1, S=4096, H=4096, FE=14336, E=8, K=2, tp=1, cp=1, ep=1)

    def flops(graph, name):
        return float(next(o for o in graph.fwd if o.name == name).flops.subs(values))

    assert flops(cap, "expert.gate") == pytest.approx(1.25 * flops(base, "expert.gate"))
    assert flops(cap, "router") == flops(base, "router")  # routing sees every token once either way
    assert np.isclose(flops(base, "expert.gate"), 2 * 4096 * 2 * 4096 * 14336)  # tokens x top-k x h x f


def test_fused_qkv_is_priced_as_one_gemm_and_shared_by_flops():
    """Q, K, V of a GQA layer at tp=8 (n = 1024, 128, 128): one GEMM of n = 1280, split by FLOPs."""
    from stageopt.hardware.kernels import Kernels, grouped_kernel_seconds

    hw = load_hardware("h100-sxm")
    m, k, ns = 4096, 8192, np.array([1024, 128, 128])
    flops = 2.0 * m * ns * k
    kern = Kernels(code=np.zeros(3, dtype=int), flops=flops, nbytes=2.0 * (m * k + k * ns + m * ns),
                   m=np.full(3, m), n=ns, k=np.full(3, k), batch=np.ones(3), precision=np.zeros(3),
                   backward=np.zeros(3, dtype=bool))
    t = grouped_kernel_seconds(hw, "bf16", kern, np.ones(3, dtype=int))  # label 1: joined on n
    assert t.sum() == pytest.approx(hw.gpu.matmul_time_s(m, 1280, k))
    assert t[1] / t[0] == pytest.approx(128 / 1024)
    alone = grouped_kernel_seconds(hw, "bf16", kern, np.full(3, -1))
    assert alone[1] == pytest.approx(hw.gpu.matmul_time_s(m, 128, k))  # a 128-column GEMM takes 256x128 tiles
    assert alone.sum() > t.sum()
    # Equal members (multi-head attention) still join: three n = 1792 projections are one n = 5376 GEMM.
    eq = Kernels(**{**kern.__dict__, "n": np.full(3, 1792), "flops": np.full(3, 2.0 * m * 1792 * k)})
    assert grouped_kernel_seconds(hw, "bf16", eq, np.ones(3, dtype=int)).sum() == pytest.approx(
        hw.gpu.matmul_time_s(m, 3 * 1792, k))


def test_megatron_fuses_qkv_and_fc1_gemms_but_eager_torch_does_not():
    from stageopt.graph.compile import compile_op_table

    spec = load_model("llama3-8b", SMALL)
    for framework, fused in (("megatron-core", True), ("torchtitan", False)):
        p = Plan.parse("tp=1 mbs=1 gbs=1", gpus=None, framework=load_profile(framework))
        table = compile_op_table("dense", arch_of(spec, p), "none")
        groups = table.groups[table.groups >= 0]
        # forward QKV and fc1, backward data and weight gradients of each: 6 groups
        assert (len(set(groups.tolist())) == 6) == fused and (len(groups) == 0) == (not fused)


def test_routed_and_shared_experts_fuse_their_gate_and_up_apart():
    """A DeepSeek-style MoE block under Megatron-Core: the shared expert's gate and up projections are one GEMM
    and the routed experts' another (TEGroupedMLP's linear_fc1), never one GEMM of both. NeMo AutoModel fuses only
    the routed experts' (gate_and_up_projs), and torchtitan neither (w1 and w3 apart)."""
    from stageopt.graph.block import build_block
    from stageopt.graph.fusion import gemm_groups

    spec = load_model("deepseek-v3", ["layers=4", "dense_layers=1"])
    for framework, expected in (("megatron-core", {"expert", "shared"}), ("nemo-automodel-te", {"expert"}),
                                ("torchtitan", set())):
        p = Plan.parse("tp=1 ep=8 mbs=1 gbs=8", gpus=None, framework=load_profile(framework))
        graph = build_block("moe", arch_of(spec, p), "none")
        ops = [op for op in graph.fwd if op.kind == "matmul"]
        members: dict[int, set[str]] = {}
        for op, label in zip(ops, gemm_groups(ops, arch_of(spec, p).fusions)):
            if label >= 0:
                members.setdefault(label, set()).add(op.name)
        fused = {"expert" if names <= {"expert.gate", "expert.up"} else "shared" for names in members.values()
                 if any(n.endswith((".gate", ".up")) for n in names)}
        assert fused == expected, framework
        for names in members.values():  # every fused GEMM is one module's gate and up
            assert names in ({"expert.gate", "expert.up"}, {"shared.gate", "shared.up"}) or \
                not any(n.endswith((".gate", ".up")) for n in names)


@pytest.mark.parametrize("stack, forward, backward, launches", [
    ("megatron-lm-2021", 38, 14, (6, 1)),  # cast, max, subtract, exp, sum, normalise; product, cast back
    ("torchtitan", 22, 26, (3, 3)),  # cast, log-softmax, NLL; zero fill, log-softmax gradient, cast back
    ("nemo-2024", 22, 10, (3, 1)),  # cast+max, subtract+exp+sum, normalise; product and cast back in one
])
def test_unfused_cross_entropy_moves_what_its_kernels_read_and_write(stack, forward, backward, launches):
    """Bytes a logit moves through the stack's unfused loss, counted kernel by kernel by hand
    (stageopt.graph.templates.LOSS_PASSES says which kernels); the loss's local sum adds one fp32 read,
    and each token's fp32 loss (or its gradient) 4 bytes more."""
    _, head = _block("gpt3-175b", SMALL, "tp=1 mbs=1 gbs=1", stack, kind="head")
    s, v = 128, 1024
    values = _values(B=1, S=s, H=256, V=v, tp=1, cp=1, ep=1)

    def per_logit(ops, names):
        picked = [o for o in ops if o.name in names]
        assert len(picked) == len(names)
        return sum(int(o.kernel_bytes.subs(values)) for o in picked) / (s * v), picked

    fwd, ce = per_logit(head.fwd, ("cross_entropy", "loss_reduce_local"))
    bwd, dce = per_logit(head.bwd, ("dcross_entropy", "dloss_reduce_local"))
    assert (fwd, bwd) == (forward + 4 / v, backward + 4 / v)
    loss = {o.name: o.launches for o in (*ce, *dce)}
    assert (loss["cross_entropy"], loss["dcross_entropy"]) == launches


@pytest.mark.parametrize("stack, forward, backward, launches", [
    ("megatron-core", 4, 6, (1, 1)),  # compiled: read x, write y; read dy and x, write dx
    ("nemo2-2025", 8, 20, (2, 4)),  # relu, pow; pow(1) copy, x2, x dy, threshold_backward
])
def test_squared_relu_moves_what_its_kernels_read_and_write(stack, forward, backward, launches):
    """Bytes an fc1 output element moves through squared ReLU, counted by hand (bf16, 2 bytes a read or write).
    Eager ``torch.pow(F.relu(x), 2)``: relu 2 + 2, pow 2 + 2 forward; autograd's pow gradient
    ``dy * (2 * r.pow(1))`` is a copy (4), a scalar product (4) and a product with dy (6), then relu's
    threshold_backward (6). A compiled stack runs each direction as one kernel."""
    _, blk = _block("gpt3-175b", [*SMALL, "activation=squared_relu", "bias=false"], "tp=1 mbs=1 gbs=1", stack)
    s, f = 128, 1024
    values = _values(B=1, S=s, H=256, F=f, tp=1, cp=1, ep=1)
    fwd = next(o for o in blk.fwd if o.name == "mlp.squared_relu")
    bwd = next(o for o in blk.bwd if o.name == "dmlp.squared_relu" and o.kind == "vector")
    assert int(fwd.kernel_bytes.subs(values)) == forward * s * f
    assert int(bwd.kernel_bytes.subs(values)) == backward * s * f
    assert (fwd.launches, bwd.launches) == launches


def test_flash_attention_through_unpadding_moves_its_gathers_and_scatters():
    """llm-foundry's attn_impl flash (profile llm-foundry-flash) gathers the query, key and value rows before
    FlashAttention's varlen kernel and scatters its output into a zero-filled buffer after: per bf16 element,
    a gather reads 2 and writes 2 bytes (one kernel), a scatter into zeros writes 2, then reads 2 and writes 2
    (two kernels). Backward is the transpose: the output's gradient gathered (4), each input's scattered (6).
    MHA with s=128, h=256: every tensor holds s*h elements. attn_impl triton (llm-foundry) has none of them."""
    s, h = 128, 256
    values = _values(B=1, S=s, H=h, G=4, R=1, D=64, tp=1, cp=1, ep=1)  # SMALL's 4 heads of 64
    _, blk = _block("gpt3-175b", [*SMALL, "bias=false"], "tp=1 mbs=1 gbs=1", "llm-foundry-flash")

    def moved(ops):
        """Bytes an element and kernels of each padding copy, by name."""
        return {o.name: (int(o.kernel_bytes.subs(values)) // (s * h), o.launches)
                for o in ops if "pad" in o.name and o.kind == "vector"}

    assert moved(blk.fwd) == {"unpad_q": (4, 1), "unpad_k": (4, 1), "unpad_v": (4, 1), "pad_output": (6, 2)}
    assert moved(blk.bwd) == {"dunpad_q": (6, 2), "dunpad_k": (6, 2), "dunpad_v": (6, 2), "dpad_output": (4, 1)}
    _, triton = _block("gpt3-175b", [*SMALL, "bias=false"], "tp=1 mbs=1 gbs=1", "llm-foundry")
    assert not [o for o in (*triton.fwd, *triton.bwd) if "pad" in o.name]
