"""Multi-token prediction (DeepSeek-V3 sec. 2.2; Megatron-Core ``--mtp-num-layers``).

Each MTP module sits on the loss stage: the shared embedding of the next tokens and the hidden state,
normed and projected 2h -> h, one more decoder layer of the model's last kind, and a prediction
through the shared output layer with its own loss. Checked against hand counts of parameters and
FLOPs, Megatron's layout rules, the logits memory of the loss stage, and a validated trace set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stageopt.cli import main
from stageopt.errors import InfeasiblePlan
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.workload import build_workload
from stageopt.workload.memory import loss_held, loss_peak_extra, stage_memory

SMALL = ["layers=4", "dense_layers=1", "seq=1024"]


def _work(extra: list[str], text: str = "tp=1 pp=2 dp=2 ep=2 mbs=1 gbs=4"):
    plan = Plan.parse(text)
    return build_workload(load_model("deepseek-v3", SMALL + extra), plan, plan.gpus)


def test_parameters_are_one_more_layer_the_projection_and_three_norms() -> None:
    """mtp_layers=1 adds a fifth (MoE) layer's parameters, the 2h x h projection and the hidden, embedding
    and final norms (h each); the output layer and embedding are shared and add nothing."""
    h = 7168
    base = _work([]).params_total
    deeper = _work([], "tp=1 pp=1 dp=2 ep=2 mbs=1 gbs=4")  # same model on one stage: same total
    assert deeper.params_total == pytest.approx(base)
    five = build_workload(load_model("deepseek-v3", ["layers=5", "dense_layers=1", "seq=1024"]),
                          Plan.parse("tp=1 pp=1 dp=2 ep=2 mbs=1 gbs=4"), 2).params_total
    assert _work(["mtp_layers=1"]).params_total == pytest.approx(five + 2 * h * h + 3 * h)


def test_model_flops_add_the_module_and_a_second_prediction() -> None:
    """Per token, the module costs a fifth layer's FLOPs plus the two h x h projections and one more
    h x vocab output GEMM (forward 2 FLOPs per weight, backward 4), against the plain 5-layer model."""
    hw = load_hardware("h100-sxm")
    h, vocab, tokens = 7168, 129280, 4 * 1024
    five = load_model("deepseek-v3", ["layers=5", "dense_layers=1", "seq=1024"])
    plan = Plan.parse("tp=1 pp=1 dp=2 ep=2 mbs=1 gbs=4")
    sim = AnalyticalSimulator()
    est5 = sim.evaluate(build_workload(five, plan, 2), hw)
    est_mtp = sim.evaluate(build_workload(load_model("deepseek-v3", SMALL + ["mtp_layers=1"]), plan, 2), hw)
    flops = lambda est: est.model_tflops_per_gpu * 1e12 * est.iteration_time_s * 2  # noqa: E731
    extra = 6 * tokens * (2 * h * h + h * vocab)
    assert flops(est_mtp) - flops(est5) == pytest.approx(extra, rel=0.02)  # elementwise ops, CE, norms apart


def test_modules_go_with_the_loss_and_layouts_name_them() -> None:
    work = _work(["mtp_layers=1"])
    last = work.chunks[-1][0]
    assert last.blocks == {"moe": 3, "mtp": 1, "mtp_head": 1, "head": 1}
    assert last.layers == ("moe", "moe", "mtp", "moe", "mtp_head")
    laid = _work(["mtp_layers=1"], "tp=1 pp=2 dp=2 ep=2 mbs=1 gbs=4 layout=Ett|ttmL")
    assert laid.chunks[1][0].blocks == {"moe": 3, "mtp": 1, "mtp_head": 1, "head": 1}


@pytest.mark.parametrize("extra, layout, says", [
    ([], "Ett|ttmL", "mtp_layers=0"),
    (["mtp_layers=1"], "Ett|ttL", "put 1 m before the L"),
    (["mtp_layers=1"], "Ettm|ttL", "without the loss"),
])
def test_layouts_that_miscount_or_misplace_modules_are_refused(extra, layout, says) -> None:
    with pytest.raises(InfeasiblePlan, match=says):
        _work(extra, f"tp=1 pp=2 dp=2 ep=2 mbs=1 gbs=4 layout={layout}")


def test_the_loss_stage_holds_two_sets_of_logits() -> None:
    plain, mtp = _work([]), _work(["mtp_layers=1"])
    logits = plain.value("head", "logits_bytes")
    assert mtp.value("mtp_head", "logits_bytes") == pytest.approx(logits)
    held, extra = (loss_held(plain.plan, logits), loss_peak_extra(plain.plan, logits))
    assert stage_memory(plain, 1).other == pytest.approx(held + extra)  # 1F1B's last stage: one micro-batch in flight
    assert stage_memory(mtp, 1).other == pytest.approx(2 * held + extra)  # ... holding both predictions' logits;
    # the two losses run one after the other, so one loss's peak


def test_an_mtp_trace_set_generates_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    args = ["--model", "deepseek-v3", "--set", "layers=4", "--set", "dense_layers=1", "--set", "seq=256",
            "--set", "mtp_layers=1", "--plan", "tp=1 pp=2 dp=2 ep=2 mbs=1 gbs=4", "--hardware", "h100-sxm"]
    assert main(["generate", *args, "--out", str(out), "--progress", "off"]) == 0
    assert main(["validate-trace", str(out)]) == 0
