"""Space files: every shipped space loads; mistakes are one-line ConfigErrors naming the key."""

from __future__ import annotations

import pytest
import yaml
from conftest import SMALL

from stageopt.errors import ConfigError, InfeasiblePlan
from stageopt.search.candidate import HardwareCatalog, make_candidate
from stageopt.search.dimensions import Dimension
from stageopt.search.space import list_spaces, load_space, resolve_space_path, space_from_dict
from stageopt.serving.serving_space import is_serving_space


@pytest.mark.parametrize("name", [n for n in list_spaces()  # serving spaces: tests/serving
                                  if not is_serving_space(resolve_space_path(n))])
def test_shipped_spaces_load(name: str) -> None:
    space = load_space(name)
    assert space.dims and space.gbs > 0


def test_required_spaces_ship() -> None:
    assert {"default", "llama3-405b-cp", "mixtral-ep", "codesign", "astra-sim"} <= set(list_spaces())


def test_dimensions_are_optuna_parameters_with_real_names_and_values() -> None:
    d = Dimension(name="tp", values=(1, 2, 4, 8))
    assert d.param == "tp" and d.distribution().choices == (1, 2, 4, 8)
    assert d.decode({"tp": 4}) == 4 and d.encode(8) == 8


def _small() -> dict:
    return yaml.safe_load(SMALL.read_text())


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["plan"].update(tpp=[1]), ["unknown key 'tpp'", "did you mean 'tp'"]),
    (lambda d: d["plan"].update(recompute=["some"]), ["plan.recompute", "'some'"]),
    (lambda d: d["plan"].update(mbs=[]), ["plan.mbs", "empty"]),
    (lambda d: d["plan"].update(mbs=[0]), ["plan.mbs", "positive integer"]),
    (lambda d: d["cluster"].update(hardware="h100"), ["unknown hardware preset 'h100'"]),
    (lambda d: d["cluster"].update(gpus="many"), ["cluster.gpus"]),
    (lambda d: d.pop("training"), ["missing 'training'"]),
    (lambda d: d.update(objectives=["speed"]), ["objective 'speed'"]),
    (lambda d: d["plan"].update(dp=[4]), ["plan.dp is derived"]),
    (lambda d: d.update(model="llama9"), ["model"]),
])
def test_bad_space_is_one_line(mutate, words) -> None:
    data = _small()
    mutate(data)
    with pytest.raises(ConfigError) as info:
        space_from_dict(data, where="bad.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("bad.yaml")
    for w in words:
        assert w in msg


def test_candidates_are_canonical() -> None:
    space = load_space("default")
    cat = HardwareCatalog(space)
    base = space.complete({"tp": 1, "pp": 2, "cp": 1, "vpp": 4, "mbs": 1, "zero": 1, "recompute": "full",
                           "sp": True, "schedule": "1f1b"})
    a = make_candidate(space, cat, base)
    b = make_candidate(space, cat, {**base, "vpp": 2, "sp": False})
    assert a.key == b.key and a.plan.vpp == 1 and not a.plan.sp  # vpp means nothing without interleaving
    with pytest.raises(InfeasiblePlan, match="gbs=1024 is not divisible"):
        make_candidate(space, cat, {**base, "pp": 1, "mbs": 4})  # dp=1024, mbs*dp > gbs
