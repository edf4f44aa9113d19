"""Candidate: the (plan, GPU count, hardware) a trial's choices stand for, in canonical form.

Why canonical: samplers propose choices that mean the same plan (vpp under a
non-interleaved schedule, sp with tp=1, ZeRO with dp=1); mapping them to one
plan makes repeats cache hits that cost nothing, and the canonical string is the
cache key. Choices that cannot run (divisibility, degrees that do not multiply to
the GPU count) raise :class:`~stageopt.errors.InfeasiblePlan` naming the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import load_profile
from stageopt.hardware import Hardware, apply_hw_overrides, load_hardware
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.search.dimensions import HW_SET_KEYS, Value
from stageopt.search.space import SearchSpace


@dataclass(frozen=True, slots=True)
class Candidate:
    """One point of the space after normalization; ``key`` identifies it in caches and storage."""

    plan: Plan
    gpus: int
    hw_key: str

    @property
    def key(self) -> str:
        return f"{self.hw_key} | gpus={self.gpus} | {self.plan}"


class HardwareCatalog:
    """Builds (once per run) the Hardware and price of each hardware choice of a space.

    Why an object and not a module cache: it lives as long as one search and is
    dropped with it (no class-level cache that grows in a long-lived worker).
    """

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._built: dict[str, tuple[Hardware, float]] = {}
        self._base = apply_hw_overrides(load_hardware(space.hardware), space.hw_set)

    def key_for(self, values: Mapping[str, Value]) -> str:
        preset = str(values.get("hardware", self.space.hardware))
        extra = [f"{HW_SET_KEYS[name]}={values[name]:g}" for name in HW_SET_KEYS if name in values]
        return " ".join([preset, *self.space.hw_set, *extra])

    def get(self, key: str) -> Hardware:
        return self._entry(key)[0]

    def price(self, key: str) -> float:
        """USD per GPU-hour of this hardware choice under the space's cost model."""
        return self._entry(key)[1]

    def _entry(self, key: str) -> tuple[Hardware, float]:
        if key not in self._built:
            preset, *overrides = key.split()
            hw = apply_hw_overrides(load_hardware(preset), overrides)
            self._built[key] = (hw, self.space.cost.per_gpu_hour(preset, hw, self._base))
        return self._built[key]


def make_candidate(space: SearchSpace, catalog: HardwareCatalog, values: Mapping[str, Value]) -> Candidate:
    """Turn a trial's choices into a valid, canonical candidate, or raise InfeasiblePlan."""
    gpus = int(values["gpus"])
    tp, cp, pp = int(values["tp"]), int(values["cp"]), int(values["pp"])
    if gpus % (tp * cp * pp):
        raise InfeasiblePlan(f"tp*cp*pp = {tp}*{cp}*{pp} = {tp * cp * pp} does not divide gpus={gpus}")
    dp = gpus // (tp * cp * pp)
    schedule, vpp = str(values["schedule"]), int(values["vpp"])
    if pp == 1:
        schedule, vpp = "1f1b", 1
    elif schedule != "interleaved" or vpp == 1:  # V-shaped schedules set their own 2 chunks per rank
        schedule, vpp = ("1f1b" if schedule == "interleaved" else schedule), 1
    zero = int(values["zero"]) if dp > 1 else 0
    split = {k: values[k] for k in ("first_layers", "last_layers", "embed_split", "loss_split")}
    if pp == 1:  # uneven splits need a pipeline
        split = {"first_layers": 0, "last_layers": 0, "embed_split": False, "loss_split": False}
    plan = Plan(tp=tp, cp=cp, pp=pp, dp=dp, ep=int(values["ep"]), vpp=vpp, mbs=int(values["mbs"]),
                gbs=space.gbs, zero=zero, recompute=str(values["recompute"]), sp=bool(values["sp"]),
                schedule=schedule, framework=load_profile(space.framework), cp_comm=str(values["cp_comm"]), **split)
    validate_plan(plan, space.model, gpus)
    return Candidate(plan=plan, gpus=gpus, hw_key=catalog.key_for(values))
