"""Every calibrated hardware preset states the error its fit left, and ``stageopt simulate`` reports it.

The figures are checked against ``experiments/validation/calibration.json``, the calibration script's own
output, which ``apply_calibration.py`` copies into the presets: a preset refitted without its record
rewritten would tell users a stale accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stageopt.cli import main
from stageopt.errors import ConfigError
from stageopt.hardware import load_hardware
from stageopt.hardware.machine import Accuracy
from stageopt.validation.calibrate import FAMILIES

CALIBRATION = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "calibration.json"
PLAN = ["--model", "llama3-8b", "--set", "layers=2", "--plan", "tp=1 pp=1 dp=8 mbs=1 gbs=16", "--json"]


@pytest.mark.parametrize("family,preset", [(f, p) for f, presets in FAMILIES.items() for p in presets])
def test_each_calibrated_preset_carries_its_familys_fit_errors(family, preset):
    fit = json.loads(CALIBRATION.read_text())[family]
    hw = load_hardware(preset)
    record = hw.measured_accuracy
    assert record is not None, f"{preset}: its accuracy record is missing or names another machine than the file's " \
                               "(a hardware field changed?); rerun experiments/validation/apply_calibration.py"
    assert record.family == family and record.runs == fit["rows"] and record.machine == hw.fingerprint()
    assert record.held_out_mape == pytest.approx(fit["held_out_mape"], abs=0.05)
    assert record.in_sample_mape == pytest.approx(fit["in_sample_mape"], abs=0.05)
    sweeps = fit["families"].values()
    assert record.ranked_sweeps == len(sweeps)
    assert record.top1_regret == pytest.approx(max(100 * f["top1_regret"] for f in sweeps), abs=0.05)


def _expected(capsys, *extra: str):
    assert main(["simulate", *PLAN, *extra]) == 0
    return json.loads(capsys.readouterr().out)["expected_error_pct"]


def test_simulate_reports_the_held_out_error_only_where_it_was_measured(capsys):
    assert _expected(capsys) == load_hardware("h100-sxm").accuracy.held_out_mape  # the default preset
    assert _expected(capsys, "--hardware", "mi300x") is None  # never fitted to published runs
    assert _expected(capsys, "--hw-set", "gpu.hbm_gib=96") is None  # another machine than the one fitted
    assert main(["simulate", *PLAN[:-1]]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("accuracy"))
    assert f"+/-{load_hardware('h100-sxm').accuracy.held_out_mape:.1f}%" in line


@pytest.mark.parametrize("field,value", [("runs", 0), ("held_out_mape", -1.0), ("in_sample_mape", -0.1),
                                         ("ranked_sweeps", -1), ("top1_regret", -0.5)])
def test_an_impossible_accuracy_record_is_refused_naming_the_field(field, value):
    good = {"family": "x", "machine": "0123456789ab", "runs": 3, "in_sample_mape": 2.0, "held_out_mape": 3.0}
    with pytest.raises(ConfigError, match=field):
        Accuracy(**{**good, field: value})


def test_the_accuracy_record_is_not_a_hardware_knob(capsys):
    from stageopt.hardware import hw_override_keys

    assert not [k for k in hw_override_keys() if k.startswith("accuracy")]
    assert main(["simulate", *PLAN, "--hw-set", "accuracy.held_out_mape=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "accuracy.held_out_mape" in err and "\n" not in err


def test_a_search_names_the_accuracy_only_of_the_machine_that_was_fitted():
    from stageopt.hardware.presets import ranking_accuracy

    record = load_hardware("b200").accuracy
    assert ranking_accuracy("b200") == (f"b200: +/-{record.held_out_mape:.1f}% per plan; in {record.ranked_sweeps} "
                                        f"published sweep of plans on blackwell the predicted-best plan ran at most "
                                        f"{record.top1_regret:.1f}% slower than the best")
    assert ranking_accuracy("b200 gpu.hbm_gib=288").startswith("b200: not measured for this machine")
    assert ranking_accuracy("b200 gpu.hbm_gib=180") == ranking_accuracy("b200")  # the same machine
    assert ranking_accuracy("mi300x").startswith("mi300x: not measured: mi300x was never fitted")


def test_an_edited_copy_of_a_preset_loses_its_accuracy_but_not_for_a_new_name_or_price(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "simulators" / "hardware" / "h100-sxm.yaml").read_text()
    renamed = tmp_path / "mine.yaml"
    renamed.write_text(text.replace("name: h100-sxm", "name: mine").replace("cost_per_gpu_hour: 3.0",
                                                                            "cost_per_gpu_hour: 2.2"))
    assert load_hardware(renamed).measured_accuracy == load_hardware("h100-sxm").accuracy
    faster = tmp_path / "faster.yaml"
    faster.write_text(text.replace("bandwidth_gbps: 450", "bandwidth_gbps: 900"))
    assert load_hardware(faster).accuracy is not None and load_hardware(faster).measured_accuracy is None


def test_each_record_still_describes_the_model_as_it_prices_today():
    """The in-sample figure is the family's MAPE under the presets as shipped: recomputed here from the published
    runs, it must match the record (to half a point), so a change to the cost model that leaves the records stale
    (rerun calibrate.py and apply_calibration.py) fails here rather than misleading users."""
    from stageopt.validation import load_runs, mape, predict_all

    runs = load_runs(CALIBRATION.parent / "published_runs.csv")
    comps, _ = predict_all(runs)
    for family, presets in FAMILIES.items():
        record = load_hardware(presets[0]).accuracy
        rows = [c for c in comps if c.run.hardware in presets]
        assert len(rows) == record.runs, family
        assert mape(rows) == pytest.approx(record.in_sample_mape, abs=0.5), family
