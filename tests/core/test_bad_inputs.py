"""Every user mistake: one line on stderr naming the field, exit code 2, no traceback."""

import pytest

from stageopt.cli import main

LLAMA = ["--model", "llama3-70b"]


def run_cli(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


CASES = [
    # (argv, words the message must contain)
    (LLAMA + ["--plan", "tp=16", "--gpus", "64"], ["tp=16", "heads"]),
    (["--model", "gpt3-175b", "--plan", "tp=5", "--gpus", "40"], ["tp=5", "heads=96"]),
    (LLAMA + ["--plan", "tp=8 pp=3 vpp=2 schedule=interleaved", "--gpus", "48"], ["pp*vpp", "layers=80"]),
    (LLAMA + ["--plan", "tp=8 pp=4", "--gpus", "100"], ["gpus=100"]),
    (LLAMA + ["--plan", "tp=8 pp=4 dp=4", "--gpus", "64"], ["gpus=64"]),
    (LLAMA + ["--plan", "tp=8 pp=4 vpp=3 schedule=interleaved", "--gpus", "64"], ["vpp", "layers=80"]),
    (LLAMA + ["--plan", "tp=8 pp=2 vpp=2", "--gpus", "16"], ["vpp=2", "schedule"]),
    (LLAMA + ["--plan", "tp=8 mbs=2 gbs=7", "--gpus", "16"], ["gbs=7"]),
    (LLAMA + ["--plan", "tp=8 pp=128", "--gpus", "1024"], ["layers=80"]),
    (["--model", "mixtral-8x7b", "--plan", "tp=1 ep=3", "--gpus", "6"], ["ep=3", "experts"]),
    (["--model", "mixtral-8x7b", "--plan", "tp=1 ep=4 dp=2", "--gpus", "2"], ["ep=4", "dp=2"]),
    (LLAMA + ["--plan", "tp=8 ep=2", "--gpus", "16"], ["ep=2"]),
    (LLAMA + ["--plan", "tp=8 cp=3", "--gpus", "24"], ["seq", "cp"]),
    (LLAMA + ["--plan", "tp=8 zero=4", "--gpus", "8"], ["zero"]),
    (LLAMA + ["--plan", "tp=8 recompute=some", "--gpus", "8"], ["recompute"]),
    (LLAMA + ["--plan", "tp=8 schedule=zigzag", "--gpus", "8"], ["schedule"]),
    (LLAMA + ["--plan", "tp=8 sp=maybe", "--gpus", "8"], ["sp"]),
    (LLAMA + ["--plan", "tp=eight", "--gpus", "8"], ["tp=eight"]),
    (LLAMA + ["--plan", "tp=-2", "--gpus", "8"], ["tp"]),
    (LLAMA + ["--plan", "tp=0", "--gpus", "8"], ["tp"]),
    (LLAMA + ["--plan", "tq=8", "--gpus", "8"], ["tq", "tp"]),
    (LLAMA + ["--plan", "tp8", "--gpus", "8"], ["tp8"]),
    (LLAMA + ["--plan", "tp=8 tp=4", "--gpus", "8"], ["twice"]),
    (LLAMA + ["--plan", "tp=8 dtype=fp64", "--gpus", "8"], ["dtype"]),
    (LLAMA + ["--plan", "tp=8 pp=2 schedule=interleaved vpp=2 mbs=1 gbs=3", "--gpus", "16"], ["gbs"]),
    (["--model", "llama3-69b", "--plan", "tp=8", "--gpus", "8"], ["llama3-69b", "llama3-70b"]),
    (["--model", "nonexistent.yaml", "--plan", "tp=8", "--gpus", "8"], ["nonexistent.yaml"]),
    (LLAMA + ["--set", "layers=-3", "--plan", "tp=8", "--gpus", "8"], ["layers"]),
    (LLAMA + ["--set", "hiddn=4096", "--plan", "tp=8", "--gpus", "8"], ["hiddn", "hidden"]),
    (LLAMA + ["--set", "layers", "--plan", "tp=8", "--gpus", "8"], ["key=value"]),
    (LLAMA + ["--set", "kv_heads=7", "--plan", "tp=1", "--gpus", "1"], ["kv_heads"]),
    (LLAMA + ["--set", "family=rnn", "--plan", "tp=1", "--gpus", "1"], ["family"]),
    (["--model", "mixtral-8x7b", "--set", "top_k=9", "--plan", "tp=1", "--gpus", "1"], ["top_k"]),
]


@pytest.mark.parametrize("argv, words", CASES)
def test_bad_input_is_one_line_exit_2(capsys, argv, words):
    code, err = run_cli(capsys, ["inspect", *argv])
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


def test_malformed_yaml(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: llama\nlayers: [1, 2\n")
    code, err = run_cli(capsys, ["inspect", "--model", str(bad), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and "malformed YAML" in err and len(err.splitlines()) == 1


def test_yaml_with_unknown_key(capsys, tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("family: llama\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\nffn: 128\nvocab: 100\nseq: 32\nlayer_count: 3\n")
    code, err = run_cli(capsys, ["inspect", "--model", str(bad), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and "layer_count" in err


def test_yaml_missing_field(capsys, tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("family: llama\nlayers: 2\n")
    code, err = run_cli(capsys, ["inspect", "--model", str(bad), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and "missing model field" in err


def test_missing_required_argument_is_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "--model", "llama3-8b"])
    assert exc.value.code == 2


# Issue 16's cases, with the words each message must hold (the attack suite covers their kinds).
HF_BASE = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}


@pytest.mark.parametrize("raw, words", [
    ('"abc"', ["num_hidden_layers", "'abc'", "not an integer"]),
    ("null", ["num_hidden_layers", "None"]),
    ("31.7", ["num_hidden_layers", "31.7", "not an integer"]),
    ("NaN", ["NaN"]),
    ("Infinity", ["Infinity"]),
    ("1e400", ["num_hidden_layers"]),
    (str(10**29), ["layers", "1e+05"]),
])
def test_hf_config_wrong_types(capsys, tmp_path, raw, words):
    import json
    text = json.dumps(HF_BASE).replace('"num_hidden_layers": 2', f'"num_hidden_layers": {raw}')
    path = tmp_path / "config.json"
    path.write_text(text)
    code, err = run_cli(capsys, ["inspect", "--model", str(path), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)


def _bomb(levels: int = 8) -> str:
    """A flow list whose last item repeats the one before ten times, ``levels`` deep (10^levels leaves)."""
    items = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    items += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def test_alias_bomb_in_model_name(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(f"name: {_bomb()}\nfamily: llama\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\n"
                    "ffn: 128\nvocab: 100\nseq: 32\n")
    code, err = run_cli(capsys, ["inspect", "--model", str(path), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and "expands to more than 100,000 nodes" in err and len(err) < 300


def test_small_alias_structure_as_model_name_is_a_type_error(capsys, tmp_path):
    """Under the expansion limit, a list where a name belongs is refused, and the message stays short."""
    path = tmp_path / "m.yaml"
    path.write_text(f"name: {_bomb(4)}\nfamily: llama\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\n"
                    "ffn: 128\nvocab: 100\nseq: 32\n")
    code, err = run_cli(capsys, ["inspect", "--model", str(path), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and "'name' must be text" in err and len(err) < 300


def test_alias_structure_in_space_plan_gives_a_short_line(capsys, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(f"model: llama3-8b\ncluster: {{gpus: 8}}\ntraining: {{global_batch: 8}}\nplan: {{tp: {_bomb(4)}}}\n")
    code, err = run_cli(capsys, ["search", "--space", str(path), "--budget", "1", "--runs-dir", str(tmp_path / "r")])
    assert code == 2 and "plan.tp" in err and len(err) < 300, err


@pytest.mark.parametrize("encode, words", [
    (lambda t: t.encode("utf-16"), ["UTF-16"]),
    (lambda t: t.encode("utf-16-le"), ["NUL bytes"]),
    (lambda t: t.encode("latin-1") + b"\xe9", ["not UTF-8", "0xe9"]),
    (lambda t: bytes(range(256)), ["NUL bytes"]),
])
def test_model_file_encoding(capsys, tmp_path, encode, words):
    path = tmp_path / "m.yaml"
    path.write_bytes(encode("family: llama\nlayers: 2\n"))
    code, err = run_cli(capsys, ["inspect", "--model", str(path), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and len(err.splitlines()) == 1
    for word in words:
        assert word in err, (word, err)


def test_yaml_with_a_null_key_is_one_line(capsys, tmp_path):
    """A lone '?' is a YAML mapping whose key is null (found by the Hypothesis attack suite)."""
    bad = tmp_path / "q.yaml"
    bad.write_text("?")
    code, err = run_cli(capsys, ["inspect", "--model", str(bad), "--plan", "tp=1", "--gpus", "1"])
    assert code == 2 and len(err.splitlines()) == 1 and "field names must be text" in err


def test_a_distributed_optimizer_over_one_data_parallel_rank_is_accepted_and_shards_nothing():
    """Megatron-Core runs --use-distributed-optimizer at dp=1 (Megatron-Bridge's Llama 3 70B SFT recipe keeps it
    at TP8 PP4 DP1 in its memory-tuning study): one shard, the same time and memory as no sharding."""
    from stageopt.sim.run import simulate_plan

    _, sharded = simulate_plan("llama3-8b", "tp=8 zero=1", 8, model_set=["layers=4"])
    _, plain = simulate_plan("llama3-8b", "tp=8 zero=0", 8, model_set=["layers=4"])
    assert sharded.iteration_time_s == plain.iteration_time_s
    assert sharded.peak_memory_gib == plain.peak_memory_gib
