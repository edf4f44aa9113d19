"""Write the fitted values of ``calibration.json``, and the errors the fit left, into the hardware presets.

Why a script: the presets in ``simulators/hardware/`` are commented YAML (every figure
beside its source), so the fitted numbers are replaced in place, line by line, and the
comments stay. Usage::

    python experiments/validation/apply_calibration.py [family ...]   # default: every fitted family
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from stageopt.hardware.presets import hardware_from_dict
from stageopt.validation.calibrate import FAMILIES

HERE = Path(__file__).resolve().parent
PRESETS = HERE.parents[1] / "simulators" / "hardware"

# fitted key -> the YAML text before its value
PATTERNS = {
    "gpu.efficiency.matmul.peak_fraction": r"(matmul: \{peak_fraction: )[0-9.]+",
    "gpu.efficiency.matmul.fp8_peak_fraction": r"(fp8_peak_fraction: )[0-9.]+",
    "gpu.efficiency.attention_forward.peak_fraction": r"(attention_forward: \{peak_fraction: )[0-9.]+",
    "gpu.efficiency.attention_backward.peak_fraction": r"(attention_backward: \{peak_fraction: )[0-9.]+",
    "gpu.efficiency.launch_us": r"(launch_us: )[0-9.]+",
    "gpu.efficiency.host_us": r"(host_us: )[0-9.]+",
}


def _format(value: float) -> str:
    return f"{value:.3g}" if value < 1 else f"{value:g}"


def accuracy_line(family: str, fit: dict, machine: str) -> str:
    """The preset's ``accuracy`` record: what ``stageopt simulate`` tells users to expect of it, for the machine
    with fingerprint ``machine`` alone."""
    sweeps = fit.get("families", {})
    regret = max((100 * f["top1_regret"] for f in sweeps.values()), default=0.0)
    return (f"accuracy: {{family: {family}, machine: '{machine}', runs: {fit['rows']}, "
            f"in_sample_mape: {fit['in_sample_mape']:.1f}, "
            f"held_out_mape: {fit['held_out_mape']:.1f}, ranked_sweeps: {len(sweeps)}, top1_regret: {regret:.1f}}}"
            "  # experiments/validation/calibration.json")


def apply(family: str, fit: dict) -> None:
    hw_set = fit["hw_set"]
    values = dict(item.split("=", 1) for item in hw_set)
    for preset in FAMILIES[family]:
        path = PRESETS / f"{preset}.yaml"
        text = path.read_text()
        for key, value in values.items():
            if key not in PATTERNS:
                raise SystemExit(f"calibration.json: {key} has no place in the presets; add it to PATTERNS")
            text, found = re.subn(PATTERNS[key], lambda m: m.group(1) + _format(float(value)), text, count=1)
            if found != 1:
                raise SystemExit(f"{path.name}: no line for {key}")
        machine = hardware_from_dict(yaml.safe_load(re.sub(r"(?m)^accuracy: .*$", "", text))).fingerprint()
        record = accuracy_line(family, fit, machine)
        text, found = re.subn(r"(?m)^accuracy: .*$", lambda m: record, text, count=1)
        if not found:  # first calibration: the record goes after the price
            text, found = re.subn(r"(?m)^(cost_per_gpu_hour: .*)$", lambda m: m.group(1) + "\n" + record, text, count=1)
        if found != 1:
            raise SystemExit(f"{path.name}: no cost_per_gpu_hour line to put the accuracy record after")
        path.write_text(text)
        print(f"{preset}: {' '.join(hw_set)}; {record.split('  #')[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Write calibration.json's fitted parameters into the presets.")
    parser.add_argument("families", nargs="*", metavar="FAMILY",
                        help="GPU families to apply (default: every one calibration.json holds)")
    families = parser.parse_args().families
    fitted = json.loads((HERE / "calibration.json").read_text())
    missing = [f for f in families if f not in fitted or f not in FAMILIES]
    if missing:
        parser.error(f"calibration.json has no fit for {', '.join(missing)}; run calibrate.py {' '.join(missing)} first")
    for family in families or [f for f in FAMILIES if f in fitted]:
        apply(family, fitted[family])


if __name__ == "__main__":
    main()
