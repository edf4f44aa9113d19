"""Candidate: the (plan, GPU count, hardware) a trial's choices stand for, in canonical form.

Why canonical: samplers and the census meet choices that mean the same plan;
mapping them to one plan makes repeats cache hits that cost nothing (and keeps
the census from scoring one plan twice); the canonical string is the cache key.
Rules 3, 4, 6, 7, 9, 12, 14 and 15 merge plans whose every simulated number is provably the
same (``tests/search/test_canonical.py`` checks each against the analytical
model and the event replay); rules 1, 2, 5 and 8 give a choice that has no meaning
its only meaning:

1. ``vpp`` means nothing unless the schedule is interleaved with pp > 1: vpp=1.
2. ``schedule=interleaved`` with vpp=1 is 1F1B: interleaving needs more than one
   model chunk per stage (Megatron builds the interleaved schedule only for a
   virtual pipeline size above 1): schedule=1f1b. It has the same time and no
   more memory.
3. With pp=1 there is no pipeline: every schedule and every split is the same,
   schedule=1f1b, and the uneven-split fields are unset (first_layers=last_layers=0,
   embed_split=loss_split=off; Megatron-Core refuses uneven first/last stages without PP).
4. GPipe and 1F1B with a single micro-batch run the same order (F then B on
   every stage): schedule=1f1b.
5. ZeRO shards over data x context parallelism; with dp*cp = 1 there is nothing to
   shard: zero=0.
6. Sequence parallelism and TP-communication overlap need TP: with tp=1, sp=off and
   tp_overlap=off (the plan already drops sp itself).
7. recompute_modules means nothing without selective recompute: recompute_modules is
   empty then. (Selective recompute is never merged into none: Megatron-Core re-runs the
   attention core even as a fused flash kernel, torchtitan re-runs matmuls and
   elementwise ops.)
8. With cp=1 there is no K/V to exchange: cp_comm=all_gather (the plan does it too);
   only the hierarchical mix (cp_comm=a2a+p2p) has an all-to-all part: cp_a2a=0 otherwise.
9. Shared-expert overlap hides the dispatch under the shared experts; a model without
   shared experts has nothing to overlap: moe_overlap=off.
10. Hybrid sharding over a copy as large as dp (or larger: the copy cannot exceed dp)
    is plain sharding, and without ZeRO there is nothing to shard: dp_shard=0.
11. Expert TP means nothing on a model without routed experts: etp=0 (the plan also
    resets etp=tp to 0).
12. recompute_layers means nothing without full recompute: 0 then; and a count at least
    the model's layers re-runs every layer of every chunk, as 0 does: 0.
13. Combined-1F1B overlap hides expert all-to-alls; with ep=1 there are none: ep_overlap=off
    (the plan also resets it).
14. The FP8 scaling recipe means nothing unless dtype=fp8: the stack's (the plan also resets it).
15. Micro-batch groups order only the interleaved schedule, and a group of pp is its default: vpp_group=0
    then (the schedule is the same step for step).

Choices that cannot run (divisibility, degrees that do not multiply to the GPU
count) raise :class:`~stageopt.errors.InfeasiblePlan` naming the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from stageopt.errors import InfeasiblePlan
from stageopt.frameworks import FrameworkProfile
from stageopt.hardware import Hardware, apply_hw_overrides, load_hardware
from stageopt.model.spec import ModelSpec
from stageopt.parallel.feasibility import validate_plan
from stageopt.parallel.plan import Plan
from stageopt.search.dimensions import HW_ALIASES, PLAN_DIMS, Value
from stageopt.search.space import SearchSpace


@dataclass(frozen=True, slots=True)
class Candidate:
    """One point of the space after normalization; ``key`` identifies it in caches and storage."""

    plan: Plan
    gpus: int
    hw_key: str
    model: ModelSpec

    @property
    def key(self) -> str:
        text = str(self.plan)
        shown = {item.split("=", 1)[0] for item in text.split()}
        filled = self.plan.stack_defaults()
        hidden = [f"{f.name}={value}" for f in dataclasses.fields(self.plan)  # fields the text leaves out, unless
                  if f.name not in shown and (value := getattr(self.plan, f.name)) != f.default  # at their default
                  and not (f.default is None and (value is False or value == filled.get(f.name)))]  # or the stack's
        return " ".join([f"{self.hw_key} | gpus={self.gpus} | {text}", *hidden, f"seq={self.model.seq}"])


class HardwareCatalog:
    """Builds (once per run) the Hardware, memory reserve and price of each hardware choice of a space.

    Why an object and not a module cache: it lives as long as one search and is
    dropped with it (no class-level cache that grows in a long-lived worker).
    ``reserve_gib`` (the CLI's ``--reserve-gib``) overrides the space's, which
    overrides the hardware file's ``gpu.reserve_gib`` (default: stageopt.hardware.headroom).
    """

    def __init__(self, space: SearchSpace, reserve_gib: float | None = None) -> None:
        self.space = space
        self.reserve_override = reserve_gib if reserve_gib is not None else space.reserve_gib
        self._built: dict[str, tuple[Hardware, float]] = {}
        self._base = apply_hw_overrides(load_hardware(space.hardware), space.hw_set)

    def key_for(self, values: Mapping[str, Value]) -> str:
        preset = str(values.get("hardware", self.space.hardware))
        extra = [f"{HW_ALIASES.get(d.name, d.name)}={_text(values[d.name])}" for d in self.space.hw_dims
                 if d.name != "hardware" and d.name in values]
        return " ".join([preset, *self.space.hw_set, *extra])

    def get(self, key: str) -> Hardware:
        return self._entry(key)[0]

    def price(self, key: str) -> float:
        """USD per GPU-hour of this hardware choice under the space's cost model."""
        return self._entry(key)[1]

    def reserve(self, key: str) -> float:
        """GiB per GPU kept free (CUDA context, NCCL buffers, allocator slack) on this hardware."""
        if self.reserve_override is not None:
            return self.reserve_override
        return self.get(key).gpu.memory_reserve_gib()

    def usable_gib(self, key: str) -> float:
        """HBM a plan's tensors may use on this hardware: capacity minus the reserve."""
        return self.get(key).gpu.hbm_gib - self.reserve(key)

    def _entry(self, key: str) -> tuple[Hardware, float]:
        if key not in self._built:
            preset, *overrides = key.split()
            hw = apply_hw_overrides(load_hardware(preset), overrides)
            self._built[key] = (hw, self.space.cost.per_gpu_hour(preset, hw, self._base))
        return self._built[key]


def _text(value: Value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def canonical(values: Mapping[str, Value], gpus: int, model: ModelSpec,
              framework: FrameworkProfile) -> dict[str, Value]:
    """The plan fields of ``values`` with the rules of this module's docstring applied."""
    v = {name: values[name] for name in PLAN_DIMS}
    tp, cp, pp = int(v["tp"]), int(v["cp"]), int(v["pp"])  # type: ignore[arg-type]
    dp = gpus // (tp * cp * pp)
    if pp == 1 or v["schedule"] != "interleaved" or v["vpp"] == 1:
        v["vpp"] = 1
        if pp == 1 or v["schedule"] == "interleaved":
            v["schedule"] = "1f1b"
    if v["schedule"] != "interleaved" or int(v["vpp_group"]) == pp:  # type: ignore[arg-type]
        v["vpp_group"] = 0
    if pp == 1:
        v.update(first_layers=0, last_layers=0, embed_split=False, loss_split=False)
    if v["schedule"] == "gpipe" and int(values["gbs"]) == int(v["mbs"]) * dp:  # type: ignore[arg-type]
        v["schedule"] = "1f1b"
    if dp * cp == 1 and v["zero"] is not None:
        v["zero"] = 0
    if tp == 1:
        v["sp"] = False if v["sp"] is not None else None
        v["tp_overlap"] = False if v["tp_overlap"] is not None else None
    if v["recompute"] != "selective" and v.get("recompute_modules"):
        v["recompute_modules"] = ""
    if cp == 1:
        v["cp_comm"] = "all_gather"
    if v["cp_comm"] != "a2a+p2p":
        v["cp_a2a"] = 0
    if not model.shared_experts:
        v["moe_overlap"] = False
    if not model.is_moe:
        v["etp"] = 0
    if int(v["ep"]) == 1:  # type: ignore[arg-type]
        v["ep_overlap"] = False
    if v["dtype"] != "fp8":
        v["fp8_recipe"] = None
    if v["recompute"] != "full" or int(v["recompute_layers"]) >= model.layers:  # type: ignore[arg-type]
        v["recompute_layers"] = 0
    zero = v["zero"] if v["zero"] is not None else framework.default_zero(dp, cp)
    if int(v["dp_shard"]) >= dp or zero == 0:  # type: ignore[arg-type]
        v["dp_shard"] = 0
    return v


def make_candidate(space: SearchSpace, catalog: HardwareCatalog, values: Mapping[str, Value]) -> Candidate:
    """Turn a trial's choices into a valid, canonical candidate, or raise InfeasiblePlan."""
    gpus = int(values["gpus"])  # type: ignore[arg-type]
    tp, cp, pp = int(values["tp"]), int(values["cp"]), int(values["pp"])  # type: ignore[arg-type]
    if gpus % (tp * cp * pp):
        raise InfeasiblePlan(f"tp*cp*pp = {tp}*{cp}*{pp} = {tp * cp * pp} does not divide gpus={gpus}")
    model = space.models_by_seq[int(values["seq"])]  # type: ignore[arg-type]
    framework = space.frameworks[str(values["framework"])]
    fields = canonical(values, gpus, model, framework)
    plan = Plan(dp=gpus // (tp * cp * pp), gbs=int(values["gbs"]), framework=framework,  # type: ignore[arg-type]
                **fields)  # type: ignore[arg-type]
    validate_plan(plan, model, gpus)
    return Candidate(plan=plan, gpus=gpus, hw_key=catalog.key_for(values), model=model)
