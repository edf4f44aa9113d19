"""Data-parallel sync overlapped under the interleaved schedule, and the buckets it travels in.

Megatron-Core launches each model chunk's gradient sync after that chunk's last backward; under the
interleaved schedule the later chunks' backward of the last group of micro-batches still follows, so the
first chunk to finish hides its sync under (1 + (vpp - 1) * group) / vpp micro-batch backward passes, not
one as under 1F1B. With pp = 2, vpp = 4 and 4 micro-batches the group is min(pp, 4) = 2: 7/4 of 1F1B's
window. Buckets: Megatron-Core's DDP grows them with the data-parallel size (max(4e7, 1e6 x dp) parameters);
Apex's distributed Adam (NeMo 1, ``bucket_cap_mb``) keeps them at a fixed size in MiB of gradients.
"""

from __future__ import annotations

import pytest

from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.sim.run import hardware_for
from stageopt.workload import build_workload

BASE = "tp=1 pp=2 dp=32 mbs=1 gbs=128 zero=0 recompute=none"  # 4 micro-batches a step
SLOW = ["gpu.efficiency.overlap_slowdown=0", "scaleout.bandwidth_gbps=1"]  # gradients outlast any window


def _exposed_dp(plan: str, simulator=None, hw=SLOW) -> float:
    work = build_workload(load_model("llama3-8b", ["layers=16"]), Plan.parse(plan), 64)
    est = (simulator or AnalyticalSimulator()).evaluate(work, hardware_for("h100-sxm", hw))
    return est.time_breakdown_s["exposed_dp_comm"]


def test_interleaving_widens_the_window_by_the_schedule_geometry():
    whole = _exposed_dp(f"{BASE} dp_overlap=off")
    hidden_1f1b = whole - _exposed_dp(BASE)
    hidden_interleaved = whole - _exposed_dp(f"{BASE} vpp=4 schedule=interleaved")
    assert whole == pytest.approx(_exposed_dp(f"{BASE} vpp=4 schedule=interleaved dp_overlap=off"))
    assert hidden_1f1b > 0
    assert hidden_interleaved / hidden_1f1b == pytest.approx((1 + (4 - 1) * 2) / 4, rel=1e-4)


def test_the_replay_also_hides_more_under_interleaving():
    """The replay runs Megatron-Core's interleaved order, chunk syncs on their own stream."""
    replay = ReplaySimulator()
    whole = _exposed_dp(f"{BASE} dp_overlap=off", replay)
    assert whole - _exposed_dp(f"{BASE} vpp=4 schedule=interleaved", replay) > whole - _exposed_dp(BASE, replay)


def test_fixed_buckets_against_megatron_core_growing_ones():
    """MLPerf v3.1's 10,752-GPU plan: Apex's 100 MiB of bf16 gradients is 52,428,800 parameters a bucket at any
    data-parallel size; Megatron-Core's rule gives 336e6 at dp = 336."""
    growing = Plan.parse("tp=4 pp=8 dp=336 mbs=1 gbs=2688 vpp=12 schedule=interleaved zero=1 dtype=fp8")
    fixed = Plan.parse("tp=4 pp=8 dp=336 mbs=1 gbs=2688 vpp=12 schedule=interleaved zero=1 dtype=fp8 bucket_mb=100")
    assert growing.dp_sync_bucket_params == pytest.approx(336e6)
    assert fixed.dp_sync_bucket_params == pytest.approx(100 * 2**20 / 2)
    assert "bucket_mb=100" in str(fixed) and Plan.parse(str(fixed).replace("framework=megatron-core", "")) == fixed


def test_more_buckets_pay_more_latency():
    """Each bucket pays its collective's latency once: the unoverlapped sync grows as the buckets shrink."""
    plan = f"{BASE} dp_overlap=off"
    fast = ["gpu.efficiency.overlap_slowdown=0"]
    times = [_exposed_dp(f"{plan} bucket_mb={mb}", hw=fast) for mb in (1024, 64, 4)]
    assert times[0] < times[1] < times[2]


def test_bf16_weights_double_the_parameter_gathers():
    """ZeRO-1 gathers FP8 weights in FP8 where the stack keeps them so (Megatron's --fp8-param-gather), in BF16
    where it does not. Gradients reduce in bf16 either way, so FP8 training with BF16 weights syncs what BF16
    training syncs, and FP8 weights save half of the gather, a quarter of the whole (reduce-scatter and gather
    move the same bytes in a ring; latency is negligible at 1 Gb/s)."""
    plan = "tp=1 pp=1 dp=64 mbs=1 gbs=64 zero=1 recompute=none dp_overlap=off"
    bf16 = _exposed_dp(f"{plan} dtype=bf16")
    assert _exposed_dp(f"{plan} dtype=fp8 fp8_params=off") == pytest.approx(bf16, rel=1e-12)
    assert (bf16 - _exposed_dp(f"{plan} dtype=fp8")) / bf16 == pytest.approx(0.25, rel=0.02)
