"""ZeRO-3 without prefetch (DeepSpeed 0.3 of 2021, profile megatron-deepspeed-2021): every parameter gather
waits for the block before it and its gradient scatter, so all ZeRO-3 communication sits on the critical path.
Checked against the sum of the program's own ZeRO-3 collectives, in the analytical model and the replay."""

from __future__ import annotations

import pytest

from stageopt.frameworks.catalog import PROFILES_DIR
from stageopt.hardware import load_hardware
from stageopt.sim.run import hardware_for
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.program import ProgramOptions, build_programs
from stageopt.program.durations import node_durations
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.replay import ReplaySimulator
from stageopt.workload import build_workload


def _work(framework: str):
    model = load_model("gpt3-175b", ["layers=4", "seq=2048"])
    plan = Plan.parse(f"tp=1 pp=1 dp=16 mbs=1 gbs=16 zero=3 recompute=full dtype=fp16 framework={framework}")
    return build_workload(model, plan, 16)


def test_synchronous_gathers_expose_every_zero3_collective() -> None:
    work, hw = _work("megatron-deepspeed-2021"), load_hardware("a100-80g")
    program = build_programs(work, ProgramOptions())[0]
    durations = node_durations(program, work, hw)
    zero3 = sum(durations[n.id] for n in program.nodes if n.phase == "zero3")
    analytical = AnalyticalSimulator().evaluate(work, hw)
    # the closed form spreads a stage's parameters evenly over its blocks; the program gathers each block's own
    assert analytical.time_breakdown_s["exposed_dp_comm"] == pytest.approx(zero3, rel=0.01)
    replay = ReplaySimulator().evaluate(work, hw)
    assert replay.iteration_time_s == pytest.approx(analytical.iteration_time_s, rel=0.01)
    assert replay.time_breakdown_s["exposed_dp_comm"] == pytest.approx(zero3, rel=0.01)


def test_prefetching_stacks_hide_what_the_synchronous_one_exposes() -> None:
    """Prefetching leaves each pass's first gather and the backward's last scatter exposed, and the compute the
    rest runs beside slows: of each second hidden the step loses 1 - 1 / (1 + overlap_slowdown). Without that
    contention it hides all but those."""
    frameworks = ("megatron-deepspeed", "megatron-deepspeed-2021")

    def exposed_dp(hw):
        times = {fw: AnalyticalSimulator().evaluate(_work(fw), hw) for fw in frameworks}
        assert times[frameworks[1]].time_breakdown_s["compute"] == pytest.approx(
            times[frameworks[0]].time_breakdown_s["compute"])
        return [times[fw].time_breakdown_s["exposed_dp_comm"] for fw in frameworks]

    free, whole = exposed_dp(hardware_for("a100-80g", ["gpu.efficiency.overlap_slowdown=0"]))
    # each pass waits for one block's gather, the backward for one block's scatter: with the step's ZeRO-3
    # traffic spread evenly over its 6 blocks (4 layers, the embedding, the output layer), one block's share
    assert free == pytest.approx(whole / 6, rel=1e-9)
    hw = load_hardware("a100-80g")
    contended, synchronous = exposed_dp(hw)
    assert synchronous == pytest.approx(whole)  # nothing overlaps, so nothing contends
    share = 1 - 1 / (1 + hw.gpu.efficiency.overlap_slowdown)
    assert contended == pytest.approx(free + share * (whole - free), rel=1e-9)



def test_gathered_parameter_buffer_holds_one_block_without_prefetch(tmp_path) -> None:
    """A stack that prefetches holds the current and the next block's gathered parameters; DeepSpeed of
    2021 gathered one block at a time. The difference is one GPT-3 block: 12 h^2 + 13 h parameters, 2 bytes."""
    profile = (PROFILES_DIR / "megatron-deepspeed-2021.yaml").read_text()
    prefetching = tmp_path / "prefetching.yaml"
    prefetching.write_text(profile.replace("zero3_prefetch: false", "zero3_prefetch: true"))
    hw = load_hardware("a100-80g")
    one, two = (AnalyticalSimulator().evaluate(_work(str(f)), hw).memory_breakdown_gib["other"] * 2**30
                for f in ("megatron-deepspeed-2021", prefetching))
    h = load_model("gpt3-175b").hidden
    assert two - one == pytest.approx((12 * h * h + 13 * h) * 2, rel=1e-6)
