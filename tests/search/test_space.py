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
    (lambda d: d["plan"].update(xyz=[1]), ["unknown key 'xyz'", "search_spaces/README.md lists the allowed keys"]),
    (lambda d: d["plan"].update(vpp=[1, 2], pp=[2, 4]), ["plan.vpp lists [2]", "no 'interleaved'"]),
    (lambda d: d["plan"].update(ep=[1, 2]), ["plan.ep lists [2]", "dense"]),
    (lambda d: d["plan"].update(schedule=["1f1b", "gpipe"]), ["'gpipe' is not implemented", "megatron-core runs"]),
    (lambda d: d["plan"].update(tp=1, sp=["on", "off"]), ["plan.sp is searched", "every tp is 1"]),
    (lambda d: d["plan"].update(gbs=[64]), ["plan.gbs belongs in training.global_batch"]),
    (lambda d: d["plan"].update(dtype=["bf16", "fp4"]), ["plan.dtype", "'fp4'", "fp8"]),
    (lambda d: d.update(framework="megatron-cor"), ["framework", "did you mean 'megatron-core'"]),
    (lambda d: d.update(codesign={"node.bandwidth_gbps": [450, -1]}), ["codesign.node.bandwidth_gbps", "-1"]),
    (lambda d: d.update(codesign={"scaleout.bandwidth": [50]}), ["unknown key 'scaleout.bandwidth'"]),
    (lambda d: d.update(codesign={"scaleout_gbps": {"low": 100, "high": 50}}), ["low 100 must be below high 50"]),
    (lambda d: d["cluster"].update(reserve_gib=-2), ["cluster.reserve_gib"]),
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


def test_plan_part_covers_batch_sequence_dtype_overlap_framework_and_any_hardware_field() -> None:
    data = _small()
    data["training"] = {"global_batch": [64, 128], "seq": [2048, 4096]}
    data["framework"] = ["megatron-core", "torchtitan"]
    data["plan"].update(dtype=["bf16", "fp8"], tp_overlap=["on", "off"], dp_overlap=["on", "off"])
    data["codesign"] = {"node.bandwidth_gbps": [450, 900], "scaleout_gbps": {"low": 25, "high": 400, "log": True}}
    data["cluster"]["reserve_gib"] = 6
    space = space_from_dict(data, where="wide.yaml")
    names = {d.name for d in space.dims}
    assert {"gbs", "seq", "framework", "dtype", "tp_overlap", "dp_overlap", "node.bandwidth_gbps",
            "scaleout_gbps"} <= names
    assert not space.enumerable and space.reserve_gib == 6.0
    cat = HardwareCatalog(space)
    values = space.complete({"gbs": 64, "seq": 2048, "framework": "torchtitan", "dtype": "fp8", "tp_overlap": False,
                             "dp_overlap": False, "node.bandwidth_gbps": 900, "scaleout_gbps": 123.5, "tp": 4,
                             "pp": 2, "mbs": 1, "zero": 1, "recompute": "full"})
    cand = make_candidate(space, cat, values)
    assert (cand.plan.gbs, cand.model.seq, cand.plan.framework.name, cand.plan.dtype) == (64, 2048, "torchtitan", "fp8")
    hw = cat.get(cand.hw_key)
    assert (hw.node.bandwidth_gbps, hw.scaleout.bandwidth_gbps) == (900, 123.5)
    assert cat.reserve(cand.hw_key) == 6.0


def test_reserve_comes_from_cli_then_space_then_hardware_file(tmp_path) -> None:
    from stageopt.hardware.headroom import default_reserve_gib

    assert default_reserve_gib(80) == pytest.approx(4.4)  # 2 GiB + 3% of HBM (stageopt/hardware/headroom.py)
    data = _small()
    data["cluster"]["hw_set"] = ["gpu.reserve_gib=3"]
    space = space_from_dict(data, where="r.yaml")
    key = HardwareCatalog(space).key_for(space.complete({}))
    assert HardwareCatalog(space).reserve(key) == 3.0  # hardware field
    data["cluster"]["reserve_gib"] = 5
    space = space_from_dict(data, where="r.yaml")
    assert HardwareCatalog(space).reserve(key) == 5.0  # space beats hardware
    assert HardwareCatalog(space, reserve_gib=1.5).reserve(key) == 1.5  # CLI beats both
