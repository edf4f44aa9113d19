"""``stageopt calibrate`` against measurements made by the simulator itself with a planted parameter.

The ground truth is known by construction: steps priced with the BF16 GEMM
share set to ``PLANTED`` must calibrate the preset (0.624) back to it, the
written hardware file must reproduce every planted step, and the held-out
figure must be as small as the in-sample one when every group agrees.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stageopt.cli import main
from stageopt.hardware import load_hardware
from stageopt.sim.run import simulate_plan
from stageopt.validation.calibrate import backward_share
from stageopt.validation.measured import load_measured

GPU = load_hardware("h100-sxm").gpu

PLANTED = 0.55
MODEL_SET = ["layers=4"]
PLANS = ["tp=1 pp=1 dp=8 mbs=1 gbs=64 dtype=bf16", "tp=2 pp=1 dp=4 mbs=2 gbs=64 dtype=bf16",
         "tp=4 pp=2 dp=1 mbs=1 gbs=32 dtype=bf16", "tp=8 pp=1 dp=1 mbs=4 gbs=32 dtype=bf16"]


def _planted_csv(tmp_path, hw_set, plans=PLANS, metric="iteration_time_s"):
    path = tmp_path / "measured.csv"
    times = []
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "model", "set", "plan", "metric", "value", "group"])
        for i, plan in enumerate(plans):
            _, est = simulate_plan("llama3-8b", plan, None, model_set=MODEL_SET, hw_set=hw_set)
            times.append(est.iteration_time_s)
            value = est.iteration_time_s if metric == "iteration_time_s" else est.tokens_per_s / 8
            out.writerow([f"run{i}", "llama3-8b", " ".join(MODEL_SET), plan, metric, f"{value:.9g}", f"g{i % 2}"])
    return path, times


def test_recovers_a_planted_gemm_share_and_writes_a_file_that_reproduces_the_steps(tmp_path, capsys):
    measured, times = _planted_csv(tmp_path, [f"gpu.efficiency.matmul.peak_fraction={PLANTED}"])
    out = tmp_path / "cluster.yaml"
    assert main(["calibrate", str(measured), "--fit", "gemm", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert float(report["fitted"]["gpu.efficiency.matmul.peak_fraction"]) == pytest.approx(PLANTED, abs=0.002)
    assert report["mape_preset"] > 3.0  # the preset's 0.624 prices these steps visibly fast
    assert report["mape_calibrated"] < 0.3 and report["mape_held_out"] < 0.3
    hw = load_hardware(out)
    assert hw.gpu.efficiency.matmul.peak_fraction == pytest.approx(PLANTED, abs=0.002)
    assert hw.name == "cluster"
    # the file states its own fit's errors, never the base preset's (which describe another fit)
    assert (hw.accuracy.family, hw.accuracy.runs) == ("measured", len(PLANS))
    assert hw.measured_accuracy == hw.accuracy  # fitted on this very machine
    assert hw.accuracy.held_out_mape == pytest.approx(report["mape_held_out"], abs=0.05)
    assert hw.accuracy.in_sample_mape == pytest.approx(report["mape_calibrated"], abs=0.05)
    assert hw.accuracy.ranked_sweeps == len(report["ranking"]) == 1  # the four plans of one model
    assert hw.accuracy.top1_regret == pytest.approx(100 * report["ranking"]["llama3-8b layers=4"]["top1_regret"])
    for plan, t in zip(PLANS, times):
        _, est = simulate_plan("llama3-8b", plan, None, model_set=MODEL_SET, hardware=str(out))
        assert est.iteration_time_s == pytest.approx(t, rel=0.005)


def test_a_parameter_no_run_is_sensitive_to_keeps_the_files_value(tmp_path, capsys):
    """A 70B layer's kernels all run far longer than any host dispatch time: host_us is not measured by them."""
    plans = ["tp=1 pp=1 dp=8 mbs=2 gbs=64 dtype=bf16", "tp=2 pp=1 dp=4 mbs=2 gbs=64 dtype=bf16",
             "tp=1 pp=2 dp=4 mbs=1 gbs=64 dtype=bf16", "tp=2 pp=2 dp=2 mbs=4 gbs=64 dtype=bf16"]
    path = tmp_path / "measured.csv"
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["model", "set", "plan", "metric", "value"])
        for plan in plans:
            _, est = simulate_plan("llama3-70b", plan, None, model_set=["layers=2"])
            out.writerow(["llama3-70b", "layers=2", plan, "tokens_per_s_per_gpu", f"{0.9 * est.tokens_per_s / 8:.9g}"])
    written = tmp_path / "h.yaml"
    assert main(["calibrate", str(path), "--fit", "gemm,host", "--out", str(written), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["not_pinned_down"] == ["gpu.efficiency.host_us"]
    assert load_hardware(written).gpu.efficiency.host_us == load_hardware("h100-sxm").gpu.efficiency.host_us


def test_measured_rows_take_their_gpus_from_the_plan_and_are_their_own_group(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("model,plan,metric,value,hw_set\n"
                    "llama3-8b,tp=2 pp=2 dp=4 mbs=1 gbs=32,tokens_per_s_per_gpu,1000,scaleout.bandwidth_gbps=25\n")
    (run,) = load_measured(path, "h100-sxm", "torchtitan", ("node.bandwidth_gbps=400",))
    assert run.gpus == 16 and run.source == run.id == "row 1" and run.framework == "torchtitan"
    assert run.hw_set == ("node.bandwidth_gbps=400", "scaleout.bandwidth_gbps=25")


@pytest.mark.parametrize("text, args, says", [
    ("model,plan,value\nllama3-8b,tp=1 dp=8,1\n", [], "column 'metric' missing"),
    ("model,plan,metric,value\nllama3-8b,tp=1 dp=8,seconds,1\n", [], "metric 'seconds' unknown"),
    ("model,plan,metric,value\nllama3-8b,tp=1 dp=8,mfu,-2\n", [], "value must be a positive finite number"),
    ("model,plan,metric,value\nllama3-8b,tp=1 dp=8,mfu,inf\n", [], "value must be a positive finite number"),
    ("model,plan,metric,value,speed\nllama3-8b,tp=1 dp=8,mfu,40,1\n", [], "unknown column 'speed'"),
    ("model,plan,metric,value\nllama3-8b,tp=3 dp=8 mbs=1,iteration_time_s,1\n", [], "row 1:"),
    ("model,plan,metric,value\nllama3-8b,tp=1 dp=8,iteration_time_s,1\n", ["--fit", "gemm"], "1 runs cannot fit"),
    ("model,plan,metric,value\nllama3-8b,tp=1 dp=8,iteration_time_s,1\n", ["--fit", "gem"], "unknown parameter 'gem'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, text, args, says):
    path = tmp_path / "m.csv"
    path.write_text(text)
    assert main(["calibrate", str(path), "--out", str(tmp_path / "x.yaml"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "x.yaml").exists()


def test_the_file_goes_through_the_input_gate(tmp_path, capsys):
    """A UTF-8 byte-order mark is fine (spreadsheets write one); UTF-16 and binary files get a named refusal."""
    text = "model,plan,metric,value\nllama3-8b,tp=1 dp=8,iteration_time_s,1\nllama3-8b,tp=2 dp=4,iteration_time_s,1\n"
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert len(load_measured(path, "h100-sxm")) == 2
    path.write_bytes(text.encode("utf-16"))
    assert main(["calibrate", str(path), "--fit", "gemm"]) == 2
    assert "UTF-16" in capsys.readouterr().err


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["calibrate", str(tmp_path / "none.csv")]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["--hardware", "h100-sxn"], "unknown hardware preset 'h100-sxn'"),
    (["--hw-set", "gpu.nonsense=1"], "gpu.nonsense"),
    (["--out", "no/such/folder/x.yaml"], "does not exist"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys, args, says):
    path = tmp_path / "m.csv"
    path.write_text("model,plan,metric,value\nllama3-8b,tp=1 dp=8,iteration_time_s,1\n"
                    "llama3-8b,tp=2 dp=4,iteration_time_s,1\n")
    assert main(["calibrate", str(path), "--fit", "gemm", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_a_fit_pressed_against_its_physical_range_is_named(tmp_path, capsys):
    """Steps 40% slower than the lowest GEMM share allowed (0.55) prices them: the fit stops at the bound and
    the report says the runs want past it, rather than presenting 0.55 as a measurement."""
    measured, _ = _planted_csv(tmp_path, ["gpu.efficiency.matmul.peak_fraction=0.55"])
    rows = list(csv.DictReader(open(measured)))
    with open(measured, "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows({**r, "value": f"{1.4 * float(r['value']):.9g}"} for r in rows)
    assert main(["calibrate", str(measured), "--fit", "gemm", "--out", str(tmp_path / "h.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["at_bound"] == {"gpu.efficiency.matmul.peak_fraction": "lower"}
    assert float(report["fitted"]["gpu.efficiency.matmul.peak_fraction"]) == pytest.approx(0.55, abs=1e-3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_random_bytes_never_give_a_traceback(tmp_path, capsys, data):
    path = tmp_path / "junk.csv"
    path.write_bytes(b"model,plan,metric,value\n" + data)
    code = main(["calibrate", str(path), "--fit", "gemm", "--out", str(tmp_path / "j.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "Traceback" not in err


def test_by_default_each_gemm_share_is_fitted_only_where_runs_use_its_precision(tmp_path):
    from stageopt.cli import build_parser
    from stageopt.commands.calibrate_command import DEFAULT_FIT, fit_keys, prepared_runs

    path = tmp_path / "fp8.csv"
    path.write_text("model,set,plan,metric,value\n" + "".join(
        f"llama3-8b,layers=2,tp={tp} dp={8 // tp} mbs=1 gbs=8 dtype=fp8,iteration_time_s,1\n" for tp in (1, 2, 4, 8)))
    runs = prepared_runs(build_parser().parse_args(["calibrate", str(path)]))
    assert fit_keys(",".join(DEFAULT_FIT), runs) == ["gpu.efficiency.matmul.fp8_peak_fraction",
                                                     "gpu.efficiency.attention_forward.peak_fraction"]
    assert "gpu.efficiency.matmul.peak_fraction" in fit_keys("gemm,fp8-gemm", runs)  # asked for: fitted


def test_a_parameter_only_one_group_is_sensitive_to_is_named_with_that_group(tmp_path, capsys):
    """At 32K tokens attention is most of a layer's time, at 256 almost none of it: what the runs say about
    the attention share comes from the long-sequence group, whose information share is then near 1, by the
    ratio of the groups' weighted sensitivities squared (derived here from two simulations per group)."""
    planted = ["gpu.efficiency.matmul.peak_fraction=0.6", "gpu.efficiency.attention_forward.peak_fraction=0.6"]
    groups = {"long": ("seq=32768", ["tp=1 pp=1 dp=8 mbs=1 gbs=8 dtype=bf16", "tp=2 pp=1 dp=4 mbs=1 gbs=8 dtype=bf16"]),
              "short": ("seq=256", ["tp=1 pp=1 dp=8 mbs=4 gbs=64 dtype=bf16", "tp=2 pp=1 dp=4 mbs=8 gbs=64 dtype=bf16"])}
    path = tmp_path / "measured.csv"
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["model", "set", "plan", "metric", "value", "group"])
        for group, (seq, plans) in groups.items():
            for plan in plans:
                _, est = simulate_plan("llama3-8b", plan, None, model_set=["layers=2", seq], hw_set=planted)
                out.writerow(["llama3-8b", f"layers=2 {seq}", plan, "iteration_time_s", f"{est.iteration_time_s:.9g}",
                              group])
    assert main(["calibrate", str(path), "--fit", "gemm,attention", "--out", str(tmp_path / "h.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    alone = report["rests_on_one_group"]
    assert alone["gpu.efficiency.attention_forward.peak_fraction"]["group"] == "long"

    def sensitivity(seq: str, plan: str) -> float:  # d log time / d attention share, by a finite difference
        def time(share: float) -> float:
            sets = [planted[0], f"gpu.efficiency.attention_forward.peak_fraction={share}",
                    f"gpu.efficiency.attention_backward.peak_fraction={backward_share(share, GPU):.6g}"]
            return simulate_plan("llama3-8b", plan, None, model_set=["layers=2", seq], hw_set=sets)[1].iteration_time_s
        return (np.log(time(0.61)) - np.log(time(0.6))) / 0.01

    info = {g: sum(sensitivity(seq, p) ** 2 for p in plans) / len(plans) for g, (seq, plans) in groups.items()}
    expected = info["long"] / (info["long"] + info["short"])  # equal weights: two rows a group
    assert expected > 0.95
    assert alone["gpu.efficiency.attention_forward.peak_fraction"]["share"] == pytest.approx(expected, abs=0.02)
    assert "gpu.efficiency.matmul.peak_fraction" not in alone  # both groups' times rest on their GEMMs
    for by_group in report["information"].values():  # every group's share of each fitted parameter, summing to 1
        assert set(by_group) == set(groups) and sum(by_group.values()) == pytest.approx(1.0)
    assert report["information"]["gpu.efficiency.attention_forward.peak_fraction"]["long"] == pytest.approx(
        alone["gpu.efficiency.attention_forward.peak_fraction"]["share"])
