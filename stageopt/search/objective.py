"""What a trial reports to Optuna: objective values, constraint values and a stored record.

Why one place: the same candidate is told from a fresh simulation, from the
cache and from storage on ``--resume``; building the values from one record
keeps the three identical. Constraints follow Optuna's convention (<= 0 is
feasible): ``valid`` is 0 for a plan that can run and ``INVALID_VIOLATION`` for
one that breaks a divisibility rule; ``memory_gib`` is peak memory plus the
per-GPU reserve (CUDA context, NCCL, allocator slack) minus HBM, i.e. minus the free memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stageopt.search.candidate import Candidate
from stageopt.sim.base import Estimate

INVALID_VIOLATION = 1000.0

# status of a told trial
OK, OOM, INVALID, FAILED = "ok", "oom", "invalid", "failed"


@dataclass(frozen=True, slots=True)
class Objective:
    """One quantity to optimize, read from a trial record."""

    name: str
    direction: str  # "minimize" | "maximize"
    field: str  # key in the record
    label: str
    penalty: float  # told for plans that cannot run (no estimate exists)

    def value(self, record: Mapping[str, Any]) -> float:
        return float(record[self.field]) if self.field in record else self.penalty


OBJECTIVE_DEFS: dict[str, Objective] = {
    "time": Objective("time", "minimize", "iteration_time_s", "iteration time (s)", 1e4),
    "throughput": Objective("throughput", "maximize", "tokens_per_s", "tokens/s", 0.0),
    "cost": Objective("cost", "minimize", "usd_per_mtok", "USD per 1M tokens", 1e4),
    "mfu": Objective("mfu", "maximize", "mfu", "MFU", 0.0),
}


def objectives_for(names: tuple[str, ...]) -> tuple[Objective, ...]:
    return tuple(OBJECTIVE_DEFS[n] for n in names)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished evaluation: its status and record (JSON-ready, stored as the trial's ``result``)."""

    status: str
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return str(self.record["key"])

    def values(self, objectives: tuple[Objective, ...]) -> list[float]:
        return [o.value(self.record) for o in objectives]

    def constraints(self) -> dict[str, float]:
        if self.status == INVALID:
            return {"valid": INVALID_VIOLATION, "memory_gib": 0.0}
        return {"valid": 0.0, "memory_gib": -float(self.record.get("free_gib", self.record["hbm_gib"]
                                                                      - self.record["peak_memory_gib"]))}


SIMULATOR_FLAGS = ("known_exit_fault", "notes")  # what a backend says about its own result (ASTRA-sim)


def base_record(cand: Candidate | None, key: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"key": key}
    if cand is not None:
        rec.update(plan=str(cand.plan), gpus=cand.gpus, hardware=cand.hw_key)
    return rec


def estimate_outcome(cand: Candidate, est: Estimate, hbm_gib: float, usd_per_gpu_hour: float,
                     backend: str, reserve_gib: float = 0.0) -> Outcome:
    """Outcome of a candidate that was estimated (by the cheap screen or by the backend).

    It fits when peak memory plus the reserve is within HBM; ``free_gib`` is what is left.
    """
    tokens_per_s = est.tokens_per_s
    record = base_record(cand, cand.key)
    record.update(
        backend=backend, iteration_time_s=est.iteration_time_s, tokens_per_s=tokens_per_s,
        model_tflops_per_gpu=est.model_tflops_per_gpu, mfu=est.mfu, peak_memory_gib=est.peak_memory_gib,
        hbm_gib=hbm_gib, reserve_gib=reserve_gib, free_gib=hbm_gib - reserve_gib - est.peak_memory_gib,
        usd_per_gpu_hour=usd_per_gpu_hour,
        usd_per_mtok=cand.gpus * usd_per_gpu_hour / 3600.0 / tokens_per_s * 1e6,
        memory_breakdown_gib=dict(est.memory_breakdown_gib), time_breakdown_s=dict(est.time_breakdown_s))
    record.update({k: est.details[k] for k in SIMULATOR_FLAGS if k in est.details})
    return Outcome(OK if record["free_gib"] >= 0 else OOM, record)


def invalid_outcome(key: str, reason: str) -> Outcome:
    return Outcome(INVALID, {"key": key, "reason": reason})


def failed_outcome(cand: Candidate, reason: str, backend: str) -> Outcome:
    record = base_record(cand, cand.key)
    record.update(backend=backend, reason=reason)
    return Outcome(FAILED, record)


# ----------------------------------------------------------------------------- the record as flat trial attributes

REPEAT = "repeat"  # status of a trial whose plan another trial already holds (told PRUNED, ``repeat_of`` = its number)
_RENAMED = {"peak_memory_gib": "memory_gib"}
_DICTS = {"time_breakdown_s": ("time_", "_s"), "memory_breakdown_gib": ("mem_", "_gib")}


def record_attrs(outcome: Outcome, *, simulated: bool) -> dict[str, Any]:
    """The outcome as flat, sortable user attributes (one scalar each), ``status`` and ``simulated`` included.

    Why flat: optuna-dashboard and ``study.trials_dataframe()`` show and sort scalar
    attributes; one JSON blob is cut at 1,024 characters and cannot be sorted.
    """
    attrs: dict[str, Any] = {"status": outcome.status, "simulated": simulated}
    for name, value in outcome.record.items():
        if name in _DICTS:
            prefix, suffix = _DICTS[name]
            attrs.update({f"{prefix}{k}{suffix}": v for k, v in value.items()})
        elif isinstance(value, Mapping):
            attrs.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            attrs[_RENAMED.get(name, name)] = value
    return attrs


def outcome_from_attrs(attrs: Mapping[str, Any]) -> Outcome | None:
    """Inverse of :func:`record_attrs`; ``None`` for a trial that holds no result (repeat, stale, old format)."""
    status = attrs.get("status")
    if status not in (OK, OOM, INVALID, FAILED) or "key" not in attrs:
        return None
    back = {v: k for k, v in _RENAMED.items()}
    record: dict[str, Any] = {}
    for name, value in attrs.items():
        if name in ("status", "simulated", "repeat_of"):
            continue
        for field_name, (prefix, suffix) in _DICTS.items():
            if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix):
                record.setdefault(field_name, {})[name[len(prefix):-len(suffix)]] = value
                break
        else:
            head, dot, tail = name.partition(".")
            if dot:
                record.setdefault(head, {})[tail] = value
            else:
                record[back.get(name, name)] = value
    return Outcome(status, record)
