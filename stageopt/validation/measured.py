"""Steps a user measured on their own cluster, read from a small CSV, as rows the calibration can fit.

Why a format of its own: the published-runs table carries citations, certainty
and source conventions a user's own measurements do not have. A user writes what
they ran (model, plan, the number they measured) and, where it is not the
command's default, the stack and the per-row overrides; everything else is
derived. Each row becomes a :class:`~stageopt.validation.runs.PublishedRun`, so
calibration prices it through the same function ``stageopt simulate`` calls.

Columns (a header row is required; order is free):

``model``, ``plan``, ``metric``, ``value``
    required: a model preset, YAML or config.json; a plan string; one of
    :data:`~stageopt.validation.runs.METRICS`; the measured number.
``set``
    model overrides, ``key=value`` separated by spaces (``seq=8192 layers=40``).
``gpus``
    GPU count (default: the plan's tp x cp x pp x dp).
``framework``
    the stack's profile name or YAML (default: the command's ``--framework``).
``hw_set``
    hardware overrides for this row only, ``key=value`` separated by spaces.
``group``
    rows measured together (one job, one software release); calibration holds
    out one group at a time (default: every row its own group).
``flops_formula``
    how ``tflops_per_gpu`` and ``mfu`` rows count FLOPs (default ``megatron``).
``id``
    a name for the row in the report (default ``row N``).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from stageopt.errors import ConfigError, StageoptError
from stageopt.inputs.gate import read_text, shorten
from stageopt.inputs.measured_columns import OPTIONAL, REQUIRED
from stageopt.parallel.plan import Plan
from stageopt.validation.flops import FORMULAS
from stageopt.validation.runs import METRICS, PublishedRun


def load_measured(path: Path | str, hardware: str, framework: str | None = None,
                  hw_set: tuple[str, ...] = ()) -> list[PublishedRun]:
    """Rows of a user's measurements CSV on ``hardware``; a one-line :class:`ConfigError` names any bad field.

    ``hw_set`` applies to every row, before each row's own ``hw_set`` column.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"measurements file {str(path)!r} not found; give a CSV with columns "
                          f"{', '.join(REQUIRED)} (see 'stageopt calibrate --help')")
    text = read_text(path, "measurements file")  # the input gate: strict UTF-8 (BOM allowed), at most 1 MiB
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise ConfigError(f"{path.name}: column {missing[0]!r} missing; the header must name "
                              f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})")
        unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
        if unknown:
            raise ConfigError(f"{path.name}: unknown column {unknown[0]!r}; columns are "
                              f"{', '.join(REQUIRED + OPTIONAL)}")
        rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]
    except csv.Error as err:
        raise ConfigError(f"{path.name}: not a readable CSV ({err}); write one run per line, comma-separated") from None
    if not rows:
        raise ConfigError(f"{path.name}: no measurements below the header; add one row per measured run")
    return [_run(row, n, path.name, hardware, framework, hw_set) for n, row in enumerate(rows, start=2)]


def _run(row: dict[str, str], line: int, name: str, hardware: str, framework: str | None,
         hw_set: tuple[str, ...]) -> PublishedRun:
    where = f"{name} line {line}"
    for column in REQUIRED:
        if not row.get(column):
            raise ConfigError(f"{where}: column {column!r} is empty; give the run's {column}")
    metric = row["metric"]
    if metric not in METRICS:
        raise ConfigError(f"{where}: metric {metric!r} unknown; use one of {', '.join(METRICS)}")
    value = _positive(row["value"], "value", where)
    formula = row.get("flops_formula") or "megatron"
    if formula not in FORMULAS:
        raise ConfigError(f"{where}: flops_formula {formula!r} unknown; use one of {', '.join(FORMULAS)}")
    gpus = int(_positive(row["gpus"], "gpus", where)) if row.get("gpus") else _plan_gpus(row["plan"], where)
    run_id = row.get("id") or f"row {line - 1}"
    return PublishedRun(
        id=run_id, source=row.get("group") or run_id, family=" ".join([row["model"], row.get("set", "")]).strip(),
        model=row["model"], model_set=tuple(row.get("set", "").split()), gpus=gpus, plan=row["plan"],
        framework=row.get("framework") or framework or "", hardware=hardware,
        hw_set=tuple(hw_set) + tuple(row.get("hw_set", "").split()), metric=metric, value=value,
        flops_formula=formula, status="ok", certainty="measured", citation=name, assumptions="")


def _positive(text: str, column: str, where: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {column} {shorten(text)} is not a number") from None
    if not (number > 0 and math.isfinite(number)):
        raise ConfigError(f"{where}: {column} must be a positive finite number, got {shorten(text)}")
    return number


def _plan_gpus(plan: str, where: str) -> int:
    try:
        return Plan.parse(plan).gpus
    except StageoptError as err:
        raise ConfigError(f"{where}: {err}") from None
