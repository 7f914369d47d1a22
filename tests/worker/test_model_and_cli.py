"""Test models, loading, the tokenizer and the ``strata worker`` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from strata.worker import cli, gpu_check
from strata.worker.models import llama
from strata.worker.models.errors import ModelLoadError
from strata.worker.models.hf_config import parse_config
from strata.worker.models.loader import load_model
from strata.worker.models.rope import RopeConfig, llama3_inv_freq
from strata.worker.tokenizer import ByteTokenizer, load_tokenizer


def test_make_model_is_deterministic(tmp_path: Path, tiny_dir: Path) -> None:
    assert cli.main(["make-model", "--preset", "tiny", "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tiny_dir / "model.safetensors"
    ).read_bytes()
    assert (tmp_path / "a" / "config.json").read_bytes() == (tiny_dir / "config.json").read_bytes()
    cli.main(["make-model", "--preset", "tiny", "--out", str(tmp_path / "b"), "--seed", "1"])
    assert (tmp_path / "b" / "model.safetensors").read_bytes() != (
        tiny_dir / "model.safetensors"
    ).read_bytes()


def test_checkpoint_uses_hugging_face_llama_names(tiny_dir: Path) -> None:
    names = set(load_file(str(tiny_dir / "model.safetensors")))
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= names
    layer = "model.layers.1."
    for part in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    ):
        assert layer + part + ".weight" in names
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] < config["num_attention_heads"]


def test_tied_embeddings_and_llama3_style_config_load(tmp_path: Path, tiny_dir: Path) -> None:
    state = load_file(str(tiny_dir / "model.safetensors"))
    del state["lm_head.weight"]
    from safetensors.torch import save_file

    save_file(state, str(tmp_path / "model.safetensors"))
    raw = json.loads((tiny_dir / "config.json").read_text())
    raw.update(tie_word_embeddings=True, eos_token_id=[257, 258], torch_dtype="bfloat16", unknown_field=1)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model = load_model(tmp_path, torch.float32, torch.device("cpu"))
    assert model.config.eos_token_ids == (257, 258)
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_missing_or_broken_model_dirs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(tmp_path, torch.float32, torch.device("cpu"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="model_type"):
        load_model(tmp_path, torch.float32, torch.device("cpu"))


def test_llama3_rope_scaling_slows_only_low_frequencies() -> None:
    scaling = RopeConfig("llama3", 500000.0, factor=8.0, original_max_position_embeddings=8192)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
    scaled = llama3_inv_freq(inv_freq, scaling)
    wavelen = 2 * torch.pi / inv_freq
    high, low = wavelen < 8192 / 4, wavelen > 8192
    assert torch.equal(scaled[high], inv_freq[high])
    torch.testing.assert_close(scaled[low], inv_freq[low] / 8)
    middle = ~high & ~low
    assert middle.any() and bool(
        ((scaled[middle] < inv_freq[middle]) & (scaled[middle] > inv_freq[middle] / 8)).all()
    )


def test_unsupported_rope_scaling_is_refused(tmp_path: Path, tiny_dir: Path) -> None:
    raw = json.loads((tiny_dir / "config.json").read_text())
    raw["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="longrope"):
        load_model(tmp_path, torch.float32, torch.device("cpu"))


def test_config_from_dict_defaults_kv_heads() -> None:
    raw = {
        "vocab_size": 8,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 16,
    }
    config = parse_config(raw, llama.ARCHITECTURE)
    assert config.num_key_value_heads == 2 and config.head_dim == 4
    assert parse_config({**raw, "head_dim": 16}, llama.ARCHITECTURE).head_dim == 16


def test_byte_tokenizer_round_trips_and_is_the_fallback(tiny_dir: Path) -> None:
    tok = load_tokenizer(tiny_dir)
    assert isinstance(tok, ByteTokenizer)
    assert tok.decode(tok.encode("héllo")) == "héllo"
    assert tok.decode([104, 105, 257]) == "hi"  # special ids are not text


def test_broken_tokenizer_json_is_an_error_not_a_silent_byte_fallback(tmp_path: Path) -> None:
    from strata.worker.tokenizer import load_tokenizer

    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"model.path: cannot load .*tokenizer.json"):
        load_tokenizer(tmp_path)


def test_hf_tokenizer_json_is_used_when_present(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hello world") == [1, 2]


def test_serve_refuses_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text("model: {name: tiny}\n")
    assert cli.main(["serve", "--config", str(path)]) == 2
    assert "model.path" in capsys.readouterr().err


def test_gpu_check_runs_on_the_cpu() -> None:
    result = gpu_check.run(device="cpu", preset="tiny", prompt_tokens=256, batch=2, decode_tokens=4)
    assert result["device"] == "cpu" and result["paged_matches_reference"] is True
    assert result["prefill_tok_s"] > 0 and result["decode_tok_s"] > 0
    assert result["ttft_cold_s"] > 0 and result["ttft_hbm_hit_s"] > 0


def test_cpu_threads_sets_torch_threads(tiny_dir: Path) -> None:
    from strata.worker.engine.llm_engine import LLMEngine
    from tests.worker.conftest import make_config

    before = torch.get_num_threads()
    try:
        LLMEngine.from_config(make_config(tiny_dir, cpu_threads=2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_fetch_model_command(tmp_path: Path, tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "model"
    assert cli.main(["fetch-model", "--source", "builtin://tiny", "--dest", str(dest)]) == 0
    assert (dest / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert cli.main(["fetch-model", "--source", "builtin://nope", "--dest", str(tmp_path / "x")]) == 2
    assert "nope" in capsys.readouterr().err
