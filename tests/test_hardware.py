"""Hardware presets, overrides, validation, efficiency and collective models, ASTRA-sim writers."""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from stageopt.astrasim.config_writer import REDUCTION_FREE_MEM_BW, astra_sim_configs, network_dims, write_astra_sim_configs
from stageopt.errors import ConfigError
from stageopt.hardware import (
    PRESETS_DIR,
    Hardware,
    apply_hw_overrides,
    hw_override_keys,
    list_hardware_presets,
    load_hardware,
)
from stageopt.hardware.collectives import CollectiveAlgorithms, alpha_beta_terms, collective_time_s
from stageopt.hardware.efficiency import gemm_padded_flops
from stageopt.hardware.kernels import Kernels, kernel_seconds

REF_CONFIGS = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "astra-sim" / "configs"
needs_reference = pytest.mark.skipif(not REF_CONFIGS.is_dir(), reason="../shared reference not present")

# Spec-sheet figures the presets must carry: (dense bf16 TFLOP/s, HBM GiB, NVLink GB/s per direction,
# GPUs per NVLink domain, scale-out GB/s per GPU).
SPEC = {
    "a100-80g": (312, 80, 300, 8, 25),
    "a100-80g-jeanzay": (312, 80, 300, 8, 6.25),
    "h100-sxm": (989.4, 80, 450, 8, 50),
    "h100-grand-teton": (989.4, 96, 450, 8, 50),
    "h200-sxm": (989.4, 141, 450, 8, 50),
    "b200": (2250, 180, 900, 8, 50),
    "gb200-nvl72": (2500, 186, 900, 72, 50),
    "gb300-nvl72": (2500, 279, 900, 72, 100),
    "mi300x": (1307.4, 192, 448, 8, 50),
}


# ----------------------------------------------------------------------------- presets


def test_preset_list_is_the_yaml_files() -> None:
    assert list_hardware_presets() == sorted(SPEC)


def test_a_power_limit_slows_tensor_cores_by_the_clock_law_and_leaves_hbm_alone() -> None:
    """500 W on a 700 W H100: tensor-core main loops take (700/500)^0.63 = 1.236x as long (closed form);
    a GEMM's output store and a streaming kernel are HBM-bound and unchanged; MFU stays against the nominal peak."""
    full = load_hardware("h100-sxm")
    capped = apply_hw_overrides(full, ["gpu.power_limit_w=500"])
    assert capped.gpu.clock_fraction() == pytest.approx((500 / 700) ** 0.63)
    assert capped.gpu.peak("bf16") == full.gpu.peak("bf16")
    gemm = (8192, 8192, 8192)
    ratio = capped.gpu.matmul_time_s(*gemm) / full.gpu.matmul_time_s(*gemm)
    fixed = full.gpu.efficiency.launch_us * 1e-6 + full.gpu.memory_time_s(8192 * 8192 * 2)  # launch, BF16 store
    expected = ((full.gpu.matmul_time_s(*gemm) - fixed) * (700 / 500) ** 0.63 + fixed) / full.gpu.matmul_time_s(*gemm)
    assert ratio == pytest.approx(expected, rel=1e-9)
    assert capped.gpu.vector_time_s(1e9) == full.gpu.vector_time_s(1e9)
    assert apply_hw_overrides(full, ["gpu.power_limit_w=800"]).gpu.clock_fraction() == 1.0  # above TDP: no boost


def test_gb300s_power_headroom_over_gb200_follows_the_clock_law_per_sm() -> None:
    """GB300 quotes GB200's dense peaks (148 SMs, 1,200 W) with 160 SMs at 1,400 W: by the clock law on power
    per SM its tensor cores sustain (160/148) x ((1400/160)/(1200/148))^0.63 = 1.1342x as much (by hand), so a
    tensor-bound GEMM takes 1/1.1342 of GB200's time at the same fitted share; MFU stays against the quoted peak."""
    gb300, gb200 = load_hardware("gb300-nvl72").gpu, load_hardware("gb200-nvl72").gpu
    by_hand = (160 / 148) * ((1400 / 160) / (1200 / 148)) ** 0.63
    assert by_hand == pytest.approx(1.1342, abs=1e-4)
    assert gb300.power_headroom() == pytest.approx(by_hand)
    assert gb200.power_headroom() == 1.0
    assert gb300.sustained_peak("fp8") == pytest.approx(5000 * by_hand)
    assert gb300.peak("fp8") == gb200.peak("fp8") == 5000
    same = apply_hw_overrides(load_hardware("gb300-nvl72"), ["gpu.efficiency.matmul.fp8_peak_fraction=0.5",
                                                            "gpu.efficiency.launch_us=1"])
    base = apply_hw_overrides(load_hardware("gb200-nvl72"), ["gpu.efficiency.matmul.fp8_peak_fraction=0.5",
                                                            "gpu.efficiency.launch_us=1"])
    m = n = k = 16384  # whole waves on both: 128 x 64 tiles of 128x256 over 148 or 160 SMs
    gemm = Kernels(code=np.array([0]), flops=np.array([2.0 * m * n * k]), nbytes=np.array([0.0]),
                   m=np.array([m]), n=np.array([n]), k=np.array([k]), batch=np.array([1]), precision=np.array([2]),
                   backward=np.array([False]), count=np.array([1]))
    t300, t200 = (kernel_seconds(hw, "fp8", gemm)[0] for hw in (same, base))
    assert t300 < t200 / 1.05  # the headroom shows through the whole kernel model


def test_a_quoted_peak_reference_needs_both_fields_and_a_tdp() -> None:
    with pytest.raises(ConfigError, match="peak_quoted_w and peak_quoted_sms go together"):
        apply_hw_overrides(load_hardware("gb300-nvl72"), ["gpu.peak_quoted_sms=null"])


def test_a_power_limit_without_a_tdp_is_refused_naming_the_field() -> None:
    hw = load_hardware("h100-sxm")
    with pytest.raises(ConfigError, match="power_limit_w needs tdp_w.*gpu.tdp_w"):
        apply_hw_overrides(apply_hw_overrides(hw, ["gpu.tdp_w=700"]), ["gpu.power_limit_w=500", "gpu.tdp_w=null"])


@pytest.mark.parametrize("name", sorted(SPEC))
def test_every_preset_loads_with_spec_figures(name: str) -> None:
    hw = load_hardware(name)
    bf16, hbm, nvlink, gpus, scaleout = SPEC[name]
    assert hw.name == name
    assert hw.gpu.peak("bf16") == pytest.approx(bf16)
    assert hw.gpu.hbm_gib == pytest.approx(hbm)
    assert hw.node.bandwidth_gbps == nvlink and hw.node.gpus == gpus
    assert hw.scaleout.bandwidth_gbps == scaleout
    assert hw.cost_per_gpu_hour > 0
    assert hw.gpu.peak_tflops.fp32 < hw.gpu.peak("bf16")
    if hw.gpu.peak_tflops.fp8 is not None:
        assert hw.gpu.peak("fp8") == pytest.approx(2 * bf16, rel=1e-3)  # FP8 is twice BF16 on all of these
    text = (PRESETS_DIR / f"{name}.yaml").read_text()
    assert "Sources:" in text and "assumption" in text  # every preset says where its figures come from


def test_preset_by_path_equals_preset_by_name() -> None:
    assert load_hardware(PRESETS_DIR / "h100-sxm.yaml") == load_hardware("h100-sxm")
    assert load_hardware(str(PRESETS_DIR / "h100-sxm.yaml")) == load_hardware("h100-sxm")


def test_hardware_is_hashable_and_pickles() -> None:
    hw = load_hardware("b200")
    assert pickle.loads(pickle.dumps(hw)) == hw
    assert hash(hw) == hash(load_hardware("b200"))


def test_a100_has_no_fp8() -> None:
    with pytest.raises(ConfigError, match="no fp8 tensor cores"):
        load_hardware("a100-80g").gpu.peak("fp8")


# ----------------------------------------------------------------------------- overrides


def test_overrides_apply_and_leave_original_alone() -> None:
    hw = load_hardware("h100-sxm")
    new = apply_hw_overrides(hw, [
        "gpu.hbm_gib=96", "gpu.hbm_gbps=4000", "node.gpus=16", "node.bandwidth_gbps=900",
        "scaleout.bandwidth_gbps=100", "scaleout.latency_us=2.5", "gpu.efficiency.matmul.peak_fraction=0.6",
        "node.collectives.all_reduce=tree", "cost_per_gpu_hour=1e1", "scaleout.nodes=32",
    ])
    assert (new.gpu.hbm_gib, new.gpu.hbm_gbps, new.node.gpus, new.node.bandwidth_gbps) == (96, 4000, 16, 900)
    assert (new.scaleout.bandwidth_gbps, new.scaleout.latency_us, new.scaleout.nodes) == (100, 2.5, 32)
    assert new.gpu.efficiency.matmul.peak_fraction == 0.6 and new.node.collectives.all_reduce == "tree"
    assert new.cost_per_gpu_hour == 10.0
    assert hw == load_hardware("h100-sxm")  # unchanged
    assert apply_hw_overrides(new, ["scaleout.nodes=null"]).scaleout.nodes is None


def test_peak_tflops_override_scales_every_dtype() -> None:
    hw = apply_hw_overrides(load_hardware("h100-sxm"), ["gpu.peak_tflops=1978.8"])
    p = hw.gpu.peak_tflops
    assert p.bf16 == pytest.approx(1978.8) and p.fp8 == pytest.approx(3957.8) and p.fp32 == pytest.approx(133.8)
    one = apply_hw_overrides(load_hardware("h100-sxm"), ["gpu.peak_tflops.fp8=3000"]).gpu.peak_tflops
    assert one.fp8 == 3000 and one.bf16 == pytest.approx(989.4)


def test_every_scalar_is_overridable() -> None:
    keys = hw_override_keys()
    for key in ("gpu.peak_tflops", "gpu.hbm_gib", "gpu.hbm_gbps", "node.gpus", "node.bandwidth_gbps",
                "scaleout.bandwidth_gbps", "scaleout.latency_us", "gpu.efficiency.memory_fraction"):
        assert key in keys
    assert "gpu.efficiency" not in keys  # groups are not values


# ----------------------------------------------------------------------------- validation


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    return path


def _h100_text() -> str:
    return (PRESETS_DIR / "h100-sxm.yaml").read_text()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.replace("  hbm_gbps: 3350\n", ""), r"gpu: missing key\(s\) hbm_gbps"),
        (lambda t: t.replace("hbm_gib: 80", "hbm_gib: 80\n  hbm_gbs: 3"), "unknown key 'hbm_gbs'; did you mean 'hbm_gbps'"),
        (lambda t: t + "colour: red\n", "hw.yaml: unknown key 'colour'"),
        (lambda t: t.replace("bandwidth_gbps: 450", "bandwidth_gbps: -450"), r"Node.bandwidth_gbps = -450.0 must be > 0"),
        (lambda t: t.replace("bandwidth_gbps: 50", "bandwidth_gbps: 0"), r"ScaleOut.bandwidth_gbps = 0.0 must be > 0"),
        (lambda t: t.replace("bf16: 989.4", "bf16: 0"), r"PeakTflops.bf16 = 0.0 must be > 0"),
        (lambda t: t.replace("hbm_gib: 80", "hbm_gib: lots"), r"gpu.hbm_gib = 'lots' is not a number"),
        (lambda t: t.replace("hbm_gbps: 3350", "hbm_gbps: 3.35e3"), r"gpu.hbm_gbps = '3.35e3' is not a number.*1.0e3"),
        (lambda t: t.replace("gpus: 8", "gpus: 8.5"), r"node.gpus = 8.5 is not an integer"),
        (lambda t: t.replace("topology: switch", "topology: torus"), r"node.topology = 'torus' must be one of"),
        (lambda t: t.replace("all_to_all: direct}\n  efficiency: 0.8\nscaleout", "all_to_all: tree}\n  efficiency: 0.8\nscaleout"),
         r"all_to_all = 'tree' is not supported; choose one of ring, direct"),
        (lambda t: re.sub(r"matmul: \{peak_fraction: [0-9.]+", "matmul: {peak_fraction: 1.5", t),
         r"MatmulEfficiency.peak_fraction = 1.5 must be <= 0.95"),
        (lambda t: t.replace("cost_per_gpu_hour: 3.0", "cost_per_gpu_hour: -1"), r"cost_per_gpu_hour = -1.0 must be > 0"),
        (lambda t: yaml.safe_dump({**yaml.safe_load(t), "gpu": 3}), r"hw.yaml.gpu = 3 must be a mapping \(Gpu\)"),
        (lambda t: t + "name: again\n", r"duplicate key 'name'"),
        (lambda t: t.replace("node:\n  gpus: 8", "node:\n  gpus: [8"), r"hw.yaml:\d+:\d+: malformed YAML"),
        (lambda t: "- just\n- a list\n", "top level must be a mapping"),
        (lambda t: t + "interpod: {bandwidth_gbps: 10, latency_us: 20}\n", "interpod is set but scaleout.nodes is null"),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    text = edit(_h100_text())
    assert text != _h100_text()
    with pytest.raises(ConfigError, match=match) as info:
        load_hardware(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown hardware preset 'h100'; did you mean 'h100-sxm'\? "
                                          r"known presets: a100-80g, a100-80g-jeanzay, b200, .*mi300x"):
        load_hardware("h100")
    with pytest.raises(ConfigError, match="hardware file 'nowhere/x.yaml' not found"):
        load_hardware("nowhere/x.yaml")


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("node.bandwith_gbps=900", "'node.bandwith_gbps' is not a hardware field; did you mean 'node.bandwidth_gbps'"),
        ("gpu.hbm=100", "did you mean 'gpu.hbm_gbps'|did you mean 'gpu.hbm_gib'"),
        ("node.bandwidth_gbps=fast", r"node.bandwidth_gbps = 'fast' is not a number"),
        ("node.bandwidth_gbps=-1", r"Node.bandwidth_gbps = -1.0 must be > 0"),
        ("gpu.peak_tflops=0", r"PeakTflops.bf16 = 0.0 must be > 0"),
        ("node.gpus=0", r"Node.gpus = 0 must be >= 1"),
        ("node.gpus", "is not key=value"),
        ("gpu.efficiency=1", "is a group, not a value; set one of gpu.efficiency.a2a_overlap_saving"),
        ("node.topology=ring", r"node.topology = 'ring' must be one of 'switch', 'fully_connected'"),
        ("interpod.bandwidth_gbps=10", "interpod is not defined in this hardware"),
        ("scaleout.latency_us=nan", "is not finite"),
    ],
)
def test_bad_overrides_name_the_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        apply_hw_overrides(load_hardware("h100-sxm"), [override])
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- efficiency


def test_gemm_tiles_and_waves_by_hand() -> None:
    # 132 SMs, 128x256 tiles. m=n=8192: 64*32 = 2048 tiles = 15 full waves and a tail of 68 tiles (k not split).
    assert gemm_padded_flops(8192, 8192, 8192, 1, 128, 256, 132) == 16 * 132 * 2 * 128 * 256 * 8192
    # 132 tiles exactly fill one wave; one more tile is a tail wave whose k is split 132 ways.
    assert gemm_padded_flops(128 * 132, 256, 64, 1, 128, 256, 132) == 132 * 2 * 128 * 256 * 64
    assert gemm_padded_flops(128 * 133, 256, 132, 1, 128, 256, 132) == 132 * 2 * 128 * 256 * (132 + 1)
    # 160 tiles: one full wave, then 28 tiles each split 4 ways (floor(132 / 28)): a quarter-k wave.
    assert gemm_padded_flops(128 * 160, 256, 8192, 1, 128, 256, 132) == 132 * 2 * 128 * 256 * (8192 + 2048)
    # m = 1000 pads to 8 row tiles, as m = 1024; batch entries add tiles.
    assert gemm_padded_flops(1000, 256, 10, 1, 128, 256, 132) == gemm_padded_flops(1024, 256, 10, 1, 128, 256, 132)
    assert gemm_padded_flops(128, 256, 10, 200, 128, 256, 132) == 132 * 2 * 128 * 256 * (10 + 10)  # tail of 68: k not split
    # Fewer tiles than SMs: k is split to fill the wave (32 tiles -> 4-way split-K, one wave).
    assert gemm_padded_flops(1, 8192, 8192, 1, 128, 256, 132) == 132 * 2 * 128 * 256 * 2048


def test_matmul_time_against_hand_roofline() -> None:
    gpu = load_hardware("h100-sxm").gpu
    mm, eff = gpu.efficiency.matmul, gpu.efficiency
    pf, launch, mem = mm.peak_fraction, eff.launch_us * 1e-6, eff.memory_fraction
    m, n, k = 8192, 8192, 8192
    # 2,048 tiles of 128x256: 15 full waves and a tail of 68 (k not split) = 16 waves. 128x128 tiles:
    # 4,096 = 31 waves and a tail of 4 split 33 ways, each tile half the work at 0.93 of the rate: dearer.
    waves = -(-(m // 128) * (n // 256) // 132)
    store = m * n * 2 / (3350e9 * mem)  # the BF16 output, written after the main loop
    compute = launch + waves * 132 * 2 * 128 * 256 * k / (pf * 989.4e12) + store
    small = launch + (31 * 132 * k + 132 * -(-k // 33)) * 2 * 128 * 128 / (0.93 * pf * 989.4e12) + store
    assert small > compute
    assert gpu.matmul_time_s(m, n, k) == pytest.approx(compute)
    # A skinny GEMM (m = 1 pads to one row tile) is memory bound: reads an 8192x8192 bf16 weight.
    skinny = launch + (8192 + 8192 * 8192 + 8192) * 2 / (3350e9 * mem)
    assert gpu.matmul_time_s(1, 8192, 8192) == pytest.approx(skinny)
    assert gpu.matmul_time_s(0, 8192, 8192) == 0.0
    assert gpu.memory_time_s(3350e9 * mem) == pytest.approx(1.0)
    fwd, bwd = eff.attention_forward, eff.attention_backward
    assert gpu.attention_time_s(1e12) == pytest.approx(launch + 1e12 / (fwd.peak_fraction * 989.4e12))
    # The backward kernel recomputes QK^T: 5 matmuls to the forward's 2 = 1.25x its 2x-forward model FLOPs.
    assert gpu.attention_time_s(1e12, backward=True) == pytest.approx(
        launch + 1.25e12 / (bwd.peak_fraction * 989.4e12))
    # Then one exponential per score on the special-function units: head dim 128 spends 4 x 128 FLOPs per
    # score forward, so 1e12 FLOPs carry 1e12 / 512 exponentials at 3.87e12 per second. Hopper's best kernel
    # (FlashAttention-3 / cuDNN) runs them under its matmuls, the longer part here (exp_overlap 1).
    mma, exps = 1e12 / (fwd.peak_fraction * 989.4e12), 1e12 / 512 / 3.87e12
    assert eff.exp_overlap == 1.0 and exps < mma
    assert gpu.attention_time_s(1e12, flops_per_score=512) == pytest.approx(launch + mma)
    # A kernel that waits for its exponentials (FlashAttention-2's design: exp_overlap 0) pays both in turn.
    serial = apply_hw_overrides(load_hardware("h100-sxm"), ["gpu.efficiency.exp_overlap=0"]).gpu
    assert serial.attention_time_s(1e12, flops_per_score=512) == pytest.approx(launch + mma + exps)
    assert gpu.matmul_time_s(m, n, k, "fp8") == pytest.approx(
        launch + waves * 132 * 2 * 128 * 256 * k / (mm.fp8_peak_fraction * 1978.9e12) + store)


def test_kernel_model_prices_like_the_scalar_helpers() -> None:
    hw = load_hardware("h100-sxm")
    gpu, launch = hw.gpu, hw.gpu.efficiency.launch_us * 1e-6
    one = np.ones(3)
    kern = Kernels(code=np.array([0, 2, 3]), flops=np.array([2.0 * 4096 ** 3, 1e12, 0.0]),
                   nbytes=np.array([3 * 2 * 4096 ** 2, 0.0, 1e9]), m=np.array([4096, 0, 0]),
                   n=np.array([4096, 0, 0]), k=np.array([4096, 0, 0]), batch=one, precision=np.zeros(3),
                   backward=np.zeros(3, dtype=bool))
    t = kernel_seconds(hw, "bf16", kern)
    assert t[0] == pytest.approx(gpu.matmul_time_s(4096, 4096, 4096))
    assert t[1] == pytest.approx(gpu.attention_time_s(0.5e12))  # causal: half the score matrix
    back = kernel_seconds(hw, "bf16", Kernels(**{**kern.__dict__, "backward": np.ones(3, dtype=bool)}))
    assert back[1] == pytest.approx(gpu.attention_time_s(0.5e12, backward=True))
    assert t[2] == pytest.approx(gpu.vector_time_s(1e9))
    # FP8 recipe: a linear GEMM runs at the fp8 rate after a cast of its activation operand
    # (read bf16, write fp8 and its transpose: 2 x the bf16 bytes), a separate memory-bound kernel.
    kern8 = Kernels(**{**kern.__dict__, "precision": np.array([1, 0, 0])})
    t8 = kernel_seconds(hw, "fp8", kern8)
    cast = launch + 2 * 2 * 4096 * 4096 / (3350e9 * gpu.efficiency.memory_fraction)
    assert t8[0] == pytest.approx(gpu.matmul_time_s(4096, 4096, 4096, "fp8") + cast)
    assert t8[1] == pytest.approx(t[1]) and t8[2] == pytest.approx(t[2])  # attention and vector stay bf16


# ----------------------------------------------------------------------------- collectives


def test_ring_all_reduce_alpha_beta() -> None:
    # 8 ranks, 1 GB over 450 GB/s, 1 us: 2*7 steps, each rank moves 2*7/8 of the buffer.
    t = collective_time_s("all_reduce", "ring", 1e9, 8, 450.0, 1.0)
    assert t == pytest.approx(14e-6 + 1.75 * 1e9 / 450e9)
    tier = load_hardware("h100-sxm").tiers[0]  # NVLink moves data at its achieved bus bandwidth
    assert tier.collective_time_s("all_reduce", 1e9, 8) == pytest.approx(
        14e-6 + 1.75 * 1e9 / (450e9 * tier.efficiency))


@pytest.mark.parametrize(
    ("kind", "algo", "n", "steps", "factor"),
    [
        ("all_gather", "ring", 4, 3, 0.75),
        ("reduce_scatter", "halving_doubling", 8, 3, 7 / 8),
        ("all_reduce", "halving_doubling", 6, 6, 10 / 6),  # ceil(log2 6) = 3 per phase
        ("all_reduce", "tree", 16, 8, 30 / 16),
        ("all_reduce", "direct", 8, 2, 14 / 8),
        ("all_to_all", "direct", 8, 1, 7 / 8),
        ("all_to_all", "ring", 4, 3, 1.5),  # link carries S/4*(1+2+3)
        ("all_gather", "ring", 1, 0, 0),
    ],
)
def test_alpha_beta_terms(kind: str, algo: str, n: int, steps: float, factor: float) -> None:
    assert alpha_beta_terms(kind, algo, n) == pytest.approx((steps, factor))  # type: ignore[arg-type]


def test_unsupported_collective_algorithm() -> None:
    with pytest.raises(ConfigError, match="all_gather = 'tree' is not supported"):
        CollectiveAlgorithms(all_gather="tree")  # type: ignore[arg-type]


def test_more_bandwidth_is_never_slower() -> None:
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        slow = collective_time_s(kind, "ring", 1e8, 8, 50.0, 5.0)  # type: ignore[arg-type]
        fast = collective_time_s(kind, "ring", 1e8, 8, 100.0, 5.0)  # type: ignore[arg-type]
        assert fast < slow


# ----------------------------------------------------------------------------- ASTRA-sim configs


def test_network_dims_from_tiers() -> None:
    hw = load_hardware("h100-sxm")
    dims = network_dims(hw, 64)
    assert [d.npus for d in dims] == [8, 8] and [d.topology for d in dims] == ["Switch", "Switch"]
    # the achieved bus bandwidth (link x efficiency), as hardware/network.py times collectives
    assert dims[0].bandwidth_gib_s == pytest.approx(450e9 * 0.8 / 2**30)  # 335.3 GiB/s
    assert dims[1].bandwidth_gib_s == pytest.approx(50e9 * 0.9 / 2**30)
    assert dims[0].latency_ns == pytest.approx(500.0)  # 1 us end to end over two switch hops
    assert [d.npus for d in network_dims(hw, 4)] == [4]
    mesh = network_dims(load_hardware("mi300x"), 8)[0]
    mi300x = load_hardware("mi300x").node
    assert mesh.topology == "FullyConnected"
    assert mesh.bandwidth_gib_s == pytest.approx(64e9 * mi300x.efficiency / 2**30)
    pods = apply_hw_overrides(hw, ["scaleout.nodes=4"])
    with pytest.raises(ConfigError, match="needs 8 nodes but scaleout.nodes=4"):
        network_dims(pods, 64)
    with pytest.raises(ConfigError, match="n_ranks=12 is not a multiple of node.gpus=8"):
        network_dims(hw, 12)


def test_interpod_tier_becomes_a_third_dimension(tmp_path: Path) -> None:
    text = _h100_text().replace("nodes: null", "nodes: 4") + "interpod: {bandwidth_gbps: 12.5, latency_us: 20}\n"
    hw = load_hardware(_write(tmp_path, text))
    assert [t.name for t in hw.tiers] == ["node", "scaleout", "interpod"]
    dims = network_dims(hw, 8 * 4 * 3)
    assert [d.npus for d in dims] == [8, 4, 3]
    assert dims[2].bandwidth_gib_s == pytest.approx(12.5e9 / 2**30) and dims[2].latency_ns == 10_000


def _same_shape(ours: object, ref: object, where: str) -> None:
    if isinstance(ref, list):
        assert isinstance(ours, list), where
        for item in ours:
            _same_shape(item, ref[0], where)
    elif isinstance(ref, (int, float)) and not isinstance(ref, bool):
        assert isinstance(ours, (int, float)) and not isinstance(ours, bool), where
    else:
        assert type(ours) is type(ref), where


@needs_reference
def test_written_configs_match_reference_schema(tmp_path: Path) -> None:
    files = write_astra_sim_configs(load_hardware("h100-sxm"), 16, tmp_path)
    system = json.loads(files.system.read_text())
    ref_system = json.loads((REF_CONFIGS / "sys_h100_roofline_2d.json").read_text())
    assert set(system) == set(ref_system)
    for key, value in ref_system.items():
        _same_shape(system[key], value, key)
    assert system["peak-perf"] == 989.4 and system["roofline-enabled"] == 0  # kernel times are in the traces
    assert system["local-mem-bw"] == REDUCTION_FREE_MEM_BW
    assert system["all-reduce-implementation"] == ["ring", "ring"]
    assert system["all-to-all-implementation"] == ["direct1", "direct1"]
    network = yaml.safe_load(files.network.read_text())
    ref_network = yaml.safe_load((REF_CONFIGS / "net_8npu_2d_ring_switch.yml").read_text())
    assert set(network) == set(ref_network)
    for key, value in ref_network.items():
        _same_shape(network[key], value, key)
        assert len(network[key]) == 2
    assert math.prod(network["npus_count"]) == 16
    assert json.loads(files.memory.read_text()) == json.loads((REF_CONFIGS / "no_memory_expansion.json").read_text())


def test_written_configs_read_back_by_the_typed_readers(tmp_path: Path) -> None:
    readers = pytest.importorskip("stageopt.astrasim.configs")
    for name in list_hardware_presets():
        hw = load_hardware(name)
        files = write_astra_sim_configs(hw, 2 * hw.node.gpus, tmp_path / name)
        sys_cfg = readers.read_system_config(files.system)
        net_cfg = readers.read_network_config(files.network)
        assert net_cfg.num_npus == 2 * hw.node.gpus
        assert sys_cfg.peak_perf_tflops == pytest.approx(hw.gpu.peak("bf16"))
        assert len(sys_cfg.all_reduce) == net_cfg.dims == 2


def test_system_config_times_kernels_from_the_traces_and_collectives_as_stageopt_does() -> None:
    hw = load_hardware("a100-80g")
    system, _, _ = astra_sim_configs(hw, 16)
    assert system["roofline-enabled"] == 0 and system["peak-perf"] == pytest.approx(312)
    assert system["preferred-dataset-splits"] == 1 and system["active-chunks-per-dimension"] == 1
    # a direct exchange through a switch goes one message at a time, so it moves at the link's rate
    assert system["all-to-all-implementation"] == ["direct1", "direct1"]
    assert system["all-reduce-implementation"] == ["ring", "ring"]
    # no collective spans every rank: one implementation, which ASTRA-sim then keeps for every group
    system, _, _ = astra_sim_configs(hw, 16, subgroups_only=True)
    assert system["all-to-all-implementation"] == ["direct1"] and system["all-reduce-implementation"] == ["ring"]
    mesh, _, _ = astra_sim_configs(load_hardware("mi300x"), 16, subgroups_only=True)
    assert mesh["all-reduce-implementation"] == ["direct", "ring"]  # tiers differ: ASTRA-sim will use ring
    with pytest.raises(ConfigError, match="no fp8 tensor cores"):
        astra_sim_configs(hw, 8, dtype="fp8")
    with pytest.raises(ConfigError, match="at least 2 ranks"):
        astra_sim_configs(hw, 1)


def test_hardware_built_in_python_is_validated() -> None:
    hw = load_hardware("h100-sxm")
    with pytest.raises(ConfigError, match="Hardware.cost_per_gpu_hour = 0.0 must be > 0"):
        Hardware(name="x", cost_per_gpu_hour=0.0, gpu=hw.gpu, node=hw.node, scaleout=hw.scaleout)


@pytest.mark.parametrize("preset, ratio", [("h100-sxm", 0.84), ("h200-sxm", 0.84), ("a100-80g", 0.75),
                                           ("b200", 0.71), ("gb200-nvl72", 0.71)])
def test_calibration_keeps_the_kernels_backward_to_forward_throughput_ratio_at_head_dim_128(preset, ratio) -> None:
    """Backward throughput (2.5x the forward's FLOPs) over forward, exponentials included: 0.75 in
    FlashAttention's papers (A100), 0.84 for cuDNN on Hopper and 0.71 on Blackwell as experiments/kernels measured
    it; with the exponentials priced apart, the tied backward matmul share must give that ratio back through the
    kernel model itself (launch costs aside: huge kernels)."""
    from stageopt.sim.run import hardware_for
    from stageopt.validation.calibrate import backward_share

    gpu = load_hardware(preset).gpu
    share = backward_share(0.6, gpu)
    tied = hardware_for(preset, ["gpu.efficiency.attention_forward.peak_fraction=0.6",
                                f"gpu.efficiency.attention_backward.peak_fraction={share}"]).gpu
    flops = 1e18
    forward = flops / tied.attention_time_s(flops, flops_per_score=4 * 128)
    backward = 2.5 * flops / tied.attention_time_s(2 * flops, backward=True, flops_per_score=8 * 128)
    assert backward / forward == pytest.approx(ratio, rel=1e-6)
    no_sfu = load_hardware("mi300x").gpu  # exponentials not priced: the plain ratio of shares
    assert backward_share(0.6, no_sfu) == pytest.approx(0.45)


def test_an_absent_nccl_section_cannot_be_half_set() -> None:
    """MI300X has no NCCL protocol section (RCCL): one field of it is a one-line error, not a traceback."""
    with pytest.raises(ConfigError, match="nccl is not defined in this hardware; add a 'nccl:' section") as info:
        apply_hw_overrides(load_hardware("mi300x"), ["nccl.ll_max_gbps=10"])
    assert "\n" not in str(info.value)
