"""Model sources: presets, YAML files, Hugging Face configs, --set overrides."""

import json

import pytest

from stageopt.errors import ConfigError
from stageopt.model import list_model_presets, load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload

REQUIRED = {"gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
            "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3"}


def test_all_required_presets_ship():
    assert REQUIRED <= set(list_model_presets())


def test_hf_llama_config(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    imported = load_model(str(path), ["seq=8192"])  # a config states no training length (see test_hf_import.py)
    assert imported == load_model("llama3-8b").replace(name=imported.name)


def test_hf_mixtral_config(tmp_path):
    cfg = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
           "max_position_embeddings": 4096, "num_local_experts": 8, "num_experts_per_tok": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    work = build_workload(load_model(str(path)), Plan.parse("tp=1"))
    assert work.params_total == pytest.approx(46.7e9, rel=0.005)


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("family: llama\nlayers: 2\nhidden: 256\nheads: 4\nkv_heads: 2\nffn: 512\nvocab: 1000\nseq: 128\n")
    m = load_model(str(path), ["layers=4", "seq=256"])
    assert (m.layers, m.seq, m.name) == (4, 256, "tiny")


def test_override_types_are_checked():
    with pytest.raises(ConfigError, match="layers"):
        load_model("llama3-8b", ["layers=many"])
