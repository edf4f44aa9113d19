"""Plan choices that could never take effect are errors, not silently dropped values.

Why: a space that lists ``vpp: [1, 2, 4]`` without the interleaved schedule, ``ep: [1, 8]``
for a dense model or ``schedule: [gpipe]`` for a stack that does not run GPipe would search
fewer plans than it says. Each rule below names the key, the values and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping

from stageopt.errors import ConfigError
from stageopt.inputs.gate import shorten
from stageopt.frameworks import FrameworkProfile
from stageopt.model.spec import ModelSpec
from stageopt.search.dimensions import Dimension, Value


def check_plan_choices(dims: tuple[Dimension, ...], fixed: Mapping[str, Value], model: ModelSpec,
                       frameworks: Mapping[str, FrameworkProfile], where: str) -> None:
    """Raise a one-line ConfigError for the first listed value that no combination can use."""
    values = {d.name: list(d.values) for d in dims}
    for name, value in fixed.items():
        values.setdefault(name, [value])
    searched = {d.name for d in dims}
    vpps = [v for v in values["vpp"] if v != 1]
    if vpps and "interleaved" not in values["schedule"]:
        raise ConfigError(f"{where}: plan.vpp lists {vpps} but plan.schedule {values['schedule']} has no "
                          "'interleaved'; vpp > 1 needs it: add interleaved to plan.schedule or set vpp: 1")
    if vpps and all(pp == 1 for pp in values["pp"]):
        raise ConfigError(f"{where}: plan.vpp lists {vpps} but every pp is 1; interleaving needs pp > 1")
    eps = [v for v in values["ep"] if v != 1]
    if eps and not model.is_moe:
        raise ConfigError(f"{where}: plan.ep lists {eps} but model {model.name} is dense (no experts); "
                          "set ep: 1 or use an MoE model")
    single_tp = all(tp == 1 for tp in values["tp"])
    for name in ("sp", "tp_overlap"):
        if name in searched and single_tp:
            raise ConfigError(f"{where}: plan.{name} is searched {values[name]} but every tp is 1, where it has "
                              f"no effect; list tp > 1 or give one {name} value")
    _check_needs(searched, values, model, where)
    _check_schedules(values["schedule"], values["pp"], frameworks, where)


def _check_schedules(schedules: list[Value], pps: list[Value], frameworks: Mapping[str, FrameworkProfile],
                     where: str) -> None:
    if all(pp == 1 for pp in pps):
        return
    for schedule in schedules:
        if not any(schedule in f.schedules for f in frameworks.values()):
            runs = "; ".join(f"{n} runs {', '.join(f.schedules)}" for n, f in frameworks.items())
            raise ConfigError(f"{where}: plan.schedule {shorten(schedule)} is not implemented by the framework ({runs}); "
                              "drop it or choose another framework")


def _check_needs(searched: set[str], values: Mapping[str, list[Value]], model: ModelSpec, where: str) -> None:
    """A searched field that only acts with pp > 1, cp > 1 or shared experts, where none is listed."""
    single_pp, single_cp = all(pp == 1 for pp in values["pp"]), all(cp == 1 for cp in values["cp"])
    needs = {"schedule": (single_pp, "every pp is 1, where no schedule applies; list pp > 1"),
             "cp_comm": (single_cp, "every cp is 1, where there is no K/V to exchange; list cp > 1"),
             "moe_overlap": (not model.shared_experts,
                             f"model {model.name} has no shared experts to overlap the dispatch with"),
             "dp_shard": (all(z == 0 for z in values.get("zero", [None])),
                          "every zero is 0, where nothing is sharded; list zero >= 1"),
             "etp": (not model.is_moe, f"model {model.name} has no routed experts to split"),
             "cp_a2a": ("a2a+p2p" not in values.get("cp_comm", ["all_gather"]),
                        "no cp_comm is a2a+p2p, the only one with an all-to-all part; list it")}
    for name in ("first_layers", "last_layers", "embed_split", "loss_split"):
        needs[name] = (single_pp, "every pp is 1, where there is no pipeline to split; list pp > 1")
    for name, (useless, why) in needs.items():
        if name in searched and useless:
            raise ConfigError(f"{where}: plan.{name} is searched {shorten(values[name])} but {why}, "
                              f"or give one {name} value")
