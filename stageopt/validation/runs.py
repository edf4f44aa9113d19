"""Published training runs as rows a user could type: model, plan string, framework, hardware.

Why rows of user inputs: validation must take the path users run. A row names
a model preset with overrides, a plan string, a framework profile and a
hardware preset; nothing else about it changes how it is simulated. The
measurement is kept in the source's own metric (tokens/s per GPU, iteration
time, TFLOP/s per GPU by the source's FLOP formula, or MFU).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

METRICS = ("tokens_per_s_per_gpu", "iteration_time_s", "tflops_per_gpu", "mfu")


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the stageopt inputs that describe its run."""

    id: str
    source: str
    family: str  # runs of one model on one cluster whose plans differ (ranked together); "" for none
    model: str
    model_set: tuple[str, ...]
    gpus: int
    plan: str
    framework: str
    hardware: str
    hw_set: tuple[str, ...]
    metric: str
    value: float
    flops_formula: str  # how the source counts FLOPs, for tflops_per_gpu and mfu rows
    status: str  # "ok", "inexpressible: <why>", or "regression: <why>" (see :attr:`regressed`)
    certainty: str
    citation: str
    assumptions: str

    @property
    def expressible(self) -> bool:
        return self.status == "ok"

    @property
    def regressed(self) -> bool:
        """Measured under a software regression its maintainers acknowledge (the status cites their issue).

        Such a row measures a bug, not the stack its profile describes: it is simulated and shown beside the
        table, but kept out of the MAPE and out of every fit.
        """
        return self.status.startswith("regression:")


def _row(row: dict[str, str | list[str]]) -> PublishedRun:
    if None in row:  # csv.DictReader files surplus fields under None: a comma in an unquoted field split it
        raise ValueError(f"{row['id']}: {len(row[None])} more fields than the header; quote every field that "
                         "contains a comma")
    if row["metric"] not in METRICS and row["status"] == "ok":
        raise ValueError(f"{row['id']}: metric {row['metric']!r} is not one of {', '.join(METRICS)}")
    return PublishedRun(
        id=row["id"], source=row["source"], family=row["family"], model=row["model"],
        model_set=tuple(row["model_set"].split()), gpus=int(float(row["gpus"])), plan=row["plan"],
        framework=row["framework"], hardware=row["hardware"], hw_set=tuple(row["hw_set"].split()),
        metric=row["metric"], value=float(row["value"]), flops_formula=row["flops_formula"],
        status=row["status"], certainty=row["certainty"], citation=row["citation"],
        assumptions=row["assumptions"])


def load_runs(path: Path | str) -> list[PublishedRun]:
    """Every row of a published-runs CSV (``experiments/validation/published_runs.csv``)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [_row(r) for r in csv.DictReader(fh)]
