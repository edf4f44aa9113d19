"""ASTRA-sim config readers: the reference files parse, mistakes are one-line ConfigErrors,
and the closed-form ring model reproduces ASTRA-sim's recorded single-collective runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stageopt.astrasim.collective_timing import chunking, symmetric_ring_collective_ns
from stageopt.astrasim.configs import CollectiveAlgo, Topology, read_network_config, read_system_config
from stageopt.chakra import CommType
from stageopt.errors import ConfigError

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
ASTRA = SHARED / "reference" / "astra-sim"

GOOD_SYSTEM = {
    "scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 2,
    "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"], "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"], "all-to-all-implementation": ["direct8"],
    "collective-optimization": "localBWAware", "local-mem-bw": 3350, "boost-mode": 0,
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_system_file_parses(tmp_path: Path) -> None:
    cfg = read_system_config(_write(tmp_path, "s.json", json.dumps(GOOD_SYSTEM)))
    assert cfg.preferred_dataset_splits == 4 and cfg.local_bw_aware and not cfg.roofline_enabled
    assert cfg.all_to_all[0].algo is CollectiveAlgo.DIRECT and cfg.all_to_all[0].window == 8


@pytest.mark.parametrize(("change", "message"), [
    ({"bogus-key": 1}, "unknown key 'bogus-key'"),
    ({"preferred-dataset-splits": None}, "missing key 'preferred-dataset-splits'"),
    ({"scheduling-policy": "RANDOM"}, "'scheduling-policy' must be"),
    ({"all-reduce-implementation": ["doubleBinaryTree"]}, "not supported by the replay"),
    ({"endpoint-delay": 2.5}, "'endpoint-delay' must be an integer"),
    ({"roofline-enabled": 1}, "missing key 'peak-perf'"),
    ({"model-shared-bus": 1}, "not supported"),
])
def test_system_file_mistakes(tmp_path: Path, change: dict, message: str) -> None:
    data = {**GOOD_SYSTEM, **change}
    data = {k: v for k, v in data.items() if v is not None}
    path = _write(tmp_path, "s.json", json.dumps(data))
    with pytest.raises(ConfigError, match=message) as err:
        read_system_config(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_network_file_parses_and_checks(tmp_path: Path) -> None:
    net = read_network_config(_write(tmp_path, "n.yml", "topology: [Ring, Switch]\nnpus_count: [2, 4]\n"
                                     "bandwidth: [200.0, 50.0]\nlatency: [500.0, 2000.0]\n"))
    assert net.topology == (Topology.RING, Topology.SWITCH) and net.num_npus == 8
    bad = _write(tmp_path, "b.yml", "topology: [Ring, Switch]\nnpus_count: [2]\nbandwidth: [1, 1]\nlatency: [0, 0]\n")
    with pytest.raises(ConfigError, match="'npus_count' has 1 entries"):
        read_network_config(bad)
    with pytest.raises(ConfigError, match="unknown"):
        read_network_config(_write(tmp_path, "t.yml", "topology: [Torus]\nnpus_count: [2]\nbandwidth: [1]\nlatency: [0]\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        read_network_config(tmp_path / "absent.yml")


def test_chunking_rules() -> None:
    assert chunking(1 << 20, CommType.ALL_REDUCE, 4, 8) == (1 << 18, 4)
    assert chunking(10, CommType.ALL_REDUCE, 4, 8) == (8, 4)      # raised to total_nodes, size to 4 x 8
    assert chunking(10, CommType.ALL_GATHER, 4, 8) == (2, 5)      # last chunk is not trimmed
    with pytest.raises(ConfigError):
        chunking(3, CommType.ALL_GATHER, 4, 8)


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("net_name", ["net_hgx_h100_8npu_switch", "net_8npu_2d_ring_switch"])
def test_closed_form_matches_astrasim_microbench(coll: str, net_name: str) -> None:
    results = ASTRA / "results.json"
    if not results.is_file():
        pytest.skip(f"reference material not available: {ASTRA}")
    run = json.loads(results.read_text())[f"microbench_{coll}_8npus__{net_name}"]
    system = read_system_config(ASTRA / "configs" / run["system"])
    net = read_network_config(ASTRA / "configs" / run["network"])
    ctype = CommType[coll.upper()]
    assert symmetric_ring_collective_ns(ctype, 1 << 20, system, net) == run["max_cycles"]
