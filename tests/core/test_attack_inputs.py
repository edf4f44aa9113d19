"""The attack suite: every file reader fed generated bad inputs answers exit 2 with one line, never a traceback.

Readers, each driven through the command a user runs: model YAML and Hugging
Face config.json (``inspect --model``), hardware YAML (``simulate --hardware``),
framework profile YAML (``inspect --framework``), search space YAML
(``search --space``), and ASTRA-sim's files as ``replay`` reads them: system
JSON, network YAML and the communicator-group JSON.

Bad inputs come from three generators: whole-file attacks (binary, UTF-16,
Latin-1, empty, wrong top level, alias bomb, recursive alias, deep nesting,
oversized, truncated, duplicate keys), value attacks (every number in a valid
file replaced by text, a list, a mapping, NaN, infinity, 10^30, a boolean) and
Hypothesis (random bytes, random values in random places). Command-line
attacks (sizes, paths, hints) are at the end.
"""

from __future__ import annotations

import codecs
import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stageopt.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "llama3-8b", "--set", "layers=2", "--set", "seq=256", "--plan", "tp=1", "--gpus", "1"]
SPACE = {"name": "attack", "model": "llama3-8b", "model_set": ["layers=2"],
         "cluster": {"gpus": 8, "hardware": "h100-sxm"}, "training": {"global_batch": 16, "seq": 256},
         "plan": {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2], "zero": [0, 1]}}
HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 256}


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip()


@pytest.fixture(scope="module")
def trace_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-rank set with the files replay reads (system.json, network.yml, comm_groups.json)."""
    out = tmp_path_factory.mktemp("attack") / "set"
    assert main(["generate", *TINY[:6], "--plan", "dp=2 tp=2 pp=2", "--gpus", "8", "--hardware", "h100-sxm",
                 "--out", str(out), "--progress", "off"]) == 0
    return out


class Reader:
    """One file kind: a valid document, how it is written, and the command that reads it."""

    def __init__(self, name: str, suffix: str, base: Callable[[Path], Any], argv: Callable[[Path, Path, Path], list[str]]):
        self.name, self.suffix, self.base, self.argv = name, suffix, base, argv

    @property
    def is_json(self) -> bool:
        return self.suffix == ".json"

    def dump(self, doc: Any) -> bytes:
        text = json.dumps(doc) if self.is_json else yaml.safe_dump(doc, sort_keys=False)
        return text.encode("utf-8")


def _replay(trace: Path, *, system: Path | None = None, network: Path | None = None,
            groups: Path | None = None) -> list[str]:
    return ["replay", "--workload", str(trace / "workload"), "--system", str(system or trace / "system.json"),
            "--network", str(network or trace / "network.yml"),
            "--comm-group", str(groups or trace / "comm_groups.json")]


READERS = [
    Reader("model-yaml", ".yaml", lambda t: yaml.safe_load((ROOT / "stageopt/model/presets/llama3-8b.yaml").read_text()),
           lambda f, t, tmp: ["inspect", "--model", str(f), "--plan", "tp=1", "--gpus", "1"]),
    Reader("hf-config", ".json", lambda t: dict(HF),
           lambda f, t, tmp: ["inspect", "--model", str(f), "--plan", "tp=1", "--gpus", "1"]),
    Reader("hardware-yaml", ".yaml", lambda t: yaml.safe_load((ROOT / "simulators/hardware/h100-sxm.yaml").read_text()),
           lambda f, t, tmp: ["simulate", *TINY, "--hardware", str(f)]),
    Reader("framework-yaml", ".yaml",
           lambda t: yaml.safe_load((ROOT / "simulators/frameworks/megatron-core.yaml").read_text()),
           lambda f, t, tmp: ["inspect", *TINY, "--framework", str(f)]),
    Reader("space-yaml", ".yaml", lambda t: json.loads(json.dumps(SPACE)),
           lambda f, t, tmp: ["search", "--space", str(f), "--budget", "1", "--runs-dir", str(tmp / "runs")]),
    Reader("system-json", ".json", lambda t: json.loads((t / "system.json").read_text()),
           lambda f, t, tmp: _replay(t, system=f)),
    Reader("network-yaml", ".yml", lambda t: yaml.safe_load((t / "network.yml").read_text()),
           lambda f, t, tmp: _replay(t, network=f)),
    Reader("comm-groups-json", ".json", lambda t: json.loads((t / "comm_groups.json").read_text()),
           lambda f, t, tmp: _replay(t, groups=f)),
]
BY_NAME = {r.name: r for r in READERS}

_BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 8))


def _whole_file_attacks(reader: Reader, doc: Any) -> dict[str, bytes]:
    valid = reader.dump(doc)
    rng = random.Random(16)
    attacks = {
        "random-bytes": bytes(rng.randrange(256) for _ in range(600)),
        "png-header": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(40),
        "utf16-bom": codecs.BOM_UTF16_LE + valid.decode().encode("utf-16-le"),
        "utf16-no-bom": valid.decode().encode("utf-16-be"),
        "utf32": valid.decode().encode("utf-32"),
        "latin1": valid + ("# caf\xe9\n" if not reader.is_json else " \xe9").encode("latin-1"),
        "empty": b"",
        "top-level-list": b"[1, 2, 3]\n",
        "top-level-scalar": b"42\n",
        "deep-nesting": b"[" * 50_000 + b"]" * 50_000,
    }
    if reader.name != "comm-groups-json":  # its limit is 1 GiB (10^7 ranks); test_gate covers the rule
        attacks["oversized"] = valid + (b" " * (5 * 2**20) if reader.is_json else b"#" * (5 * 2**20))
    attacks |= {
        "not-a-mapping-inside": (b'{"a": [1, {"b": ' if reader.is_json else b"a: [1, {b: "),
    }
    if reader.is_json:
        attacks["truncated"] = valid[: len(valid) // 2]  # (a cut YAML file can still be a valid, shorter one)
        attacks["nan-constant"] = valid.replace(b"}", b', "x": NaN}', 1) if valid.endswith(b"}") else b"NaN"
        first = next(iter(doc)) if isinstance(doc, dict) and doc else "x"
        attacks["duplicate-key"] = b"{" + f'"{first}": 1, "{first}": 2'.encode() + b"}"
    else:
        attacks["alias-bomb"] = (b"l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + _BOMB.encode() + b"name: *l7\n"
                                 + valid)
        attacks["recursive-alias"] = b"a: &a [*a]\n" + valid
        first = next(iter(doc)) if isinstance(doc, dict) and doc else "x"
        attacks["duplicate-key"] = valid + f"{first}: 1\n".encode()
        attacks["python-tag"] = b"!!python/object/apply:os.system ['echo pwned']\n"
    return attacks


def _leaves(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths of every number (not bool) in a parsed document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, path + (i,))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield path


def _replace(doc: Any, path: tuple, value: Any) -> Any:
    copy = json.loads(json.dumps(doc))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


BAD_VALUES = {"text": "abc", "list": ["x"], "mapping": {"k": 1}, "nan": math.nan, "inf": math.inf,
              "huge-int": 10**30, "huge-float": 1e30, "bool": True}


def _typed_leaves(doc: Any) -> Iterator[tuple]:
    """Paths of every text or true/false value (the framework profile has no numbers)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if isinstance(v, (str, bool)):
                yield (k,)


WRONG_TYPES = {"huge-int": 10**30, "list": ["x"], "mapping": {"k": 1}}


def _value_attack_ids(doc: Any, typed: bool = False) -> list[str]:
    ids = [f"{'.'.join(map(str, path))}={label}" for path in _leaves(doc) for label in BAD_VALUES]
    if typed:
        ids += [f"{path[0]}={label}" for path in _typed_leaves(doc) for label in WRONG_TYPES]
    return ids


def _cases() -> list[tuple[str, str, str]]:
    """(reader, family, attack) ids; the documents are built in the test (some need the trace set)."""
    static_docs = {"model-yaml", "hf-config", "hardware-yaml", "framework-yaml", "space-yaml"}
    cases = []
    for reader in READERS:
        for name in _whole_file_attacks(reader, {"a": 1}):
            cases.append((reader.name, "file", name))
        if reader.name in static_docs:
            for name in _value_attack_ids(reader.base(Path()), typed=reader.name == "framework-yaml"):
                cases.append((reader.name, "value", name))
    return cases


# The trace-set readers' numbers are known without the set: their value attacks are listed explicitly.
TRACE_VALUE_PATHS = {
    "system-json": ["endpoint-delay", "active-chunks-per-dimension", "preferred-dataset-splits", "local-mem-bw",
                    "roofline-enabled", "peak-perf", "boost-mode"],
    "network-yaml": ["npus_count.0", "bandwidth.0", "latency.0"],
    "comm-groups-json": ["1.0", "1.1", "5.0"],
}
TRACE_CASES = [(r, "value", f"{p}={label}") for r, paths in TRACE_VALUE_PATHS.items() for p in paths
               for label in BAD_VALUES]


def _check_one_line_exit_2(code: int, err: str, what: str) -> None:
    assert "Traceback" not in err, what
    assert code == 2, f"{what}: exit {code}, stderr {err[:300]!r}"
    assert len(err.splitlines()) == 1 and len(err) < 400, f"{what}: {err[:500]!r}"


@pytest.mark.parametrize("reader_name, family, attack", _cases() + TRACE_CASES)
def test_attack(capsys, tmp_path, trace_set, reader_name, family, attack) -> None:
    reader = BY_NAME[reader_name]
    doc = reader.base(trace_set)
    if family == "file":
        data = _whole_file_attacks(reader, doc)[attack]
    else:
        where, label = attack.rsplit("=", 1)
        data = reader.dump(_replace(doc, _path_in(doc, where), {**BAD_VALUES, **WRONG_TYPES}[label]))
    target = tmp_path / f"attack{reader.suffix}"
    target.write_bytes(data)
    code, err = run_cli(capsys, reader.argv(target, trace_set, tmp_path))
    _check_one_line_exit_2(code, err, f"{reader_name} {attack}")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _path_in(doc: Any, dotted: str) -> tuple:
    """``"plan.tp.0"`` as keys and list indices of ``doc``."""
    path: list[Any] = []
    for part in dotted.split("."):
        key: Any = int(part) if isinstance(doc, list) else part
        path.append(key)
        doc = doc[key]
    return tuple(path)


def test_valid_documents_pass(capsys, tmp_path, trace_set) -> None:
    """The attacks start from documents every reader accepts, so each refusal is the attack's doing."""
    for reader in READERS:
        if reader.name == "space-yaml":
            continue  # a full search; test_search_cli covers valid spaces
        target = tmp_path / f"ok{reader.suffix}"
        target.write_bytes(reader.dump(reader.base(trace_set)))
        code, err = run_cli(capsys, reader.argv(target, trace_set, tmp_path))
        assert code == 0, (reader.name, err)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(READERS), data=st.binary(max_size=400))
def test_random_bytes(capsys, tmp_path_factory, trace_set, reader, data) -> None:
    target = tmp_path_factory.mktemp("bytes") / f"f{reader.suffix}"
    target.write_bytes(data)
    code, err = run_cli(capsys, reader.argv(target, trace_set, target.parent))
    _check_one_line_exit_2(code, err, f"{reader.name} {data[:40]!r}")


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-(10**40), 10**40), st.floats(), st.text(max_size=30),
                 st.lists(st.integers(), max_size=4), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(READERS), pick=st.integers(0, 10**6), value=JUNK)
def test_random_value_in_random_place(capsys, tmp_path_factory, trace_set, reader, pick, value) -> None:
    """Any value anywhere: accepted (exit 0) or refused in one line (exit 2), never a traceback."""
    doc = reader.base(trace_set)
    paths = list(_leaves(doc)) or [()]
    path = paths[pick % len(paths)]
    mutated = _replace(doc, path, value) if path else value
    target = tmp_path_factory.mktemp("value") / f"f{reader.suffix}"
    target.write_bytes(reader.dump(mutated))
    code, err = run_cli(capsys, reader.argv(target, trace_set, target.parent))
    assert "Traceback" not in err
    assert code in (0, 2), (reader.name, path, value, err)
    if code == 2:
        assert len(err.splitlines()) == 1, err


# ----------------------------------------------------------------------------- command-line attacks

ARG_CASES = [
    (["inspect", *TINY[:6], "--plan", "tp=1", "--gpus", str(2**62)], ["--gpus", "1e+07"]),
    (["inspect", *TINY[:6], "--plan", "tp=1", "--gpus", "0"], ["--gpus"]),
    (["inspect", *TINY[:6], "--plan", "tp=1", "--gpus", "-8"], ["--gpus"]),
    (["inspect", "--model", "llama3-8b", "--set", f"layers={10**29}", "--plan", "tp=1", "--gpus", "1"],
     ["layers", "1e+05"]),
    (["inspect", "--model", "llama3-8b", "--set", "layers=1e29", "--plan", "tp=1", "--gpus", "1"], ["layers"]),
    (["inspect", "--model", "llama3-8b", "--set", "seq=" + "9" * 5000, "--plan", "tp=1", "--gpus", "1"], ["seq"]),
    (["inspect", *TINY[:6], "--plan", f"tp=1 dp={2**40}"], ["dp", "1e+07"]),
    (["inspect", *TINY[:6], "--plan", f"tp=1 gbs={10**20}"], ["gbs"]),
    (["inspect", *TINY[:6], "--plan", "tp=1 pp=" + "9" * 5000], ["pp"]),
    (["inspect", *TINY[:6], "--plan", "tp=1", "--gpus", "1", "--set", "zzz=1"], ["zzz", "presets --fields"]),
    (["simulate", *TINY, "--hw-set", "gpu.hbm_gib=nan"], ["hbm_gib", "finite"]),
    (["simulate", *TINY, "--hw-set", "gpu.hbm_gib=1e999"], ["hbm_gib"]),
    (["simulate", *TINY, "--hw-set", f"node.gpus={10**30}"], ["node.gpus"]),
    (["simulate", *TINY, "--hw-set", f"node.gpus={10**11}"], ["node.gpus", "1e+07"]),
    (["validate-trace", "/nonexistent-dir"], ["/nonexistent-dir"]),
]


@pytest.mark.parametrize("argv, words", ARG_CASES)
def test_argument_attack(capsys, argv, words) -> None:
    code, err = run_cli(capsys, argv)
    _check_one_line_exit_2(code, err, " ".join(argv)[:80])
    for word in words:
        assert word in err, (word, err)


def test_presets_fields_exists(capsys) -> None:
    """The --set hint points to a command that lists the model fields."""
    assert main(["presets", "--fields"]) == 0
    out = capsys.readouterr().out
    assert "layers" in out and "at most 1e+05" in out


@pytest.mark.parametrize("name", ["../../../escape", "/tmp/abs-escape", "..", "a/b", ".hidden", ""])
def test_space_name_cannot_leave_runs_dir(capsys, tmp_path, name) -> None:
    space = dict(SPACE, name=name)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    runs = tmp_path / "deep" / "runs"
    code, err = run_cli(capsys, ["search", "--space", str(path), "--budget", "1", "--runs-dir", str(runs)])
    _check_one_line_exit_2(code, err, name)
    assert "name" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]
    assert not Path("/tmp/abs-escape").exists()


@pytest.mark.parametrize("prefix", ["../../evil", "/tmp/evil-abs", "a/b", "..", ""])
def test_generate_prefix_cannot_leave_out_dir(capsys, tmp_path, prefix) -> None:
    out = tmp_path / "a" / "out"
    code, err = run_cli(capsys, ["generate", *TINY, "--hardware", "h100-sxm", "--out", str(out), "--prefix", prefix])
    _check_one_line_exit_2(code, err, prefix)
    assert "--prefix" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_replay_peak_perf_zero(capsys, tmp_path, trace_set) -> None:
    system = json.loads((trace_set / "system.json").read_text())
    system["peak-perf"] = 0
    system["roofline-enabled"] = 1  # generated sets time kernels from the traces; the roofline divides by it
    path = tmp_path / "system.json"
    path.write_text(json.dumps(system))
    code, err = run_cli(capsys, _replay(trace_set, system=path))
    _check_one_line_exit_2(code, err, "peak-perf 0")
    assert "'peak-perf'" in err and "> 0" in err


def test_replay_refuses_splits_that_would_take_hours(capsys, tmp_path, trace_set) -> None:
    """preferred-dataset-splits multiplies the replay's work; 10^5 ran for minutes before it was bounded."""
    system = json.loads((trace_set / "system.json").read_text())
    system["preferred-dataset-splits"] = 100_000
    path = tmp_path / "system.json"
    path.write_text(json.dumps(system))
    code, err = run_cli(capsys, _replay(trace_set, system=path))
    _check_one_line_exit_2(code, err, "splits 1e5")
    assert "preferred-dataset-splits" in err and "1024" in err


def test_replay_names_group_rank_beyond_network(capsys, tmp_path, trace_set) -> None:
    groups = json.loads((trace_set / "comm_groups.json").read_text())
    groups["1"] = groups["1"] + [99]
    path = tmp_path / "groups.json"
    path.write_text(json.dumps(groups))
    code, err = run_cli(capsys, _replay(trace_set, groups=path))
    _check_one_line_exit_2(code, err, "rank 99")
    assert "[99]" in err and "8 ranks" in err


def test_replay_without_group_file_names_the_argument(capsys, trace_set) -> None:
    argv = [a for a in _replay(trace_set) if a != "--comm-group" and not a.endswith("comm_groups.json")]
    code, err = run_cli(capsys, argv)
    _check_one_line_exit_2(code, err, "no --comm-group")
    assert "no --comm-group file was given" in err and "comm_groups.json" in err


def test_validate_trace_refuses_absurd_rank_file(capsys, tmp_path, trace_set) -> None:
    d = tmp_path / "set"
    d.mkdir()
    (d / "workload.0.et").write_bytes((trace_set / "workload.0.et").read_bytes())
    (d / f"workload.{2**62}.et").write_bytes(b"")
    code, err = run_cli(capsys, ["validate-trace", str(d)])
    _check_one_line_exit_2(code, err, "rank 2^62")
    assert "1e+07" in err


def test_comm_group_file_size_limit(tmp_path, monkeypatch) -> None:
    """The comm-group file's own limit (1 GiB, for 10^7 ranks) is enforced like the others."""
    from stageopt.chakra import comm_groups
    from stageopt.errors import ConfigError

    monkeypatch.setattr(comm_groups, "GROUP_FILE_MAX_BYTES", 100)
    path = tmp_path / "g.json"
    path.write_text(json.dumps({str(i): [0, 1] for i in range(1, 40)}))
    with pytest.raises(ConfigError, match="larger than"):
        comm_groups.read_comm_groups(path)


def test_case_count() -> None:
    """The suite's size, reported in the project notes (issue 16)."""
    total = len(_cases()) + len(TRACE_CASES) + len(ARG_CASES)
    assert total > 300, total


@pytest.mark.parametrize("reader_name, key, value", [
    ("system-json", "local-mem-bw", 2.225073858507e-311),  # hypothesis found it: 1/x overflowed the replay's clock
    ("network-yaml", "bandwidth", 1e-300),
])
def test_rates_too_small_to_time_are_refused_in_one_line(capsys, tmp_path, trace_set, reader_name, key, value) -> None:
    reader = BY_NAME[reader_name]
    doc = reader.base(trace_set)
    doc[key] = [value] * len(doc[key]) if isinstance(doc[key], list) else value
    target = tmp_path / f"f{reader.suffix}"
    target.write_bytes(reader.dump(doc))
    code, err = run_cli(capsys, reader.argv(target, trace_set, tmp_path))
    _check_one_line_exit_2(code, err, key)
    assert key in err


def test_no_local_memory_bandwidth_makes_reductions_free(capsys, tmp_path, trace_set) -> None:
    from stageopt.astrasim.collective_timing import reduction_delay_ns

    assert reduction_delay_ns(1 << 20, 0.0) == 0
    assert reduction_delay_ns(10**9, 1000.0) == 3 * 10**6  # 1 GB at 1,000 GB/s: 1 ms, three passes
    reader = BY_NAME["system-json"]
    doc = reader.base(trace_set)
    doc["local-mem-bw"] = 0
    target = tmp_path / "system.json"
    target.write_bytes(reader.dump(doc))
    code, err = run_cli(capsys, reader.argv(target, trace_set, tmp_path))
    assert code == 0, err
