"""config.json read into one DecoderConfig: which architecture, the RoPE block in either layout,
the sliding window, and every setting the engine cannot run refused at load with a message
naming the key, its value and what is supported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.models import llama, mistral, qwen2, qwen3
from strata.worker.models.errors import ModelLoadError
from strata.worker.models.hf_config import check_context, parse_config
from strata.worker.models.loader import load_model
from strata.worker.models.registry import read_config, resolve
from strata.worker.models.rope import RopeConfig
from tests.worker.conftest import make_config

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def write(directory: Path, raw: dict[str, Any]) -> Path:
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def changed(**changes: Any) -> dict[str, Any]:
    """BASE with keys changed; a value of None removes the key."""
    raw = {**BASE, **changes}
    return {k: v for k, v in raw.items() if v is not None}


# (config.json, what the refusal must say: the key and its value, then what is supported)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "hidden_act": (changed(hidden_act="gelu"), r"hidden_act 'gelu' is not supported \(silu, swish\)"),
    "rope_type": (
        changed(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
        r"rope_parameters.rope_type 'longrope' is not supported \(default, linear, dynamic, llama3, yarn\)",
    ),
    "legacy rope type": (
        changed(rope_parameters=None, rope_theta=1e4, rope_scaling={"type": "su", "factor": 2.0}),
        r"rope_scaling.type 'su' is not supported",
    ),
    "architectures": (
        changed(architectures=["GPT2LMHeadModel"], model_type=None),
        r"architectures \['GPT2LMHeadModel'\] is not supported \(LlamaForCausalLM, Qwen2ForCausalLM, "
        r"Qwen3ForCausalLM, MistralForCausalLM\)",
    ),
    "architectures not a list": (
        changed(architectures="LlamaForCausalLM"),
        r"architectures 'LlamaForCausalLM'",
    ),
    "model_type": (
        changed(architectures=None, model_type="gpt2"),
        r"model_type 'gpt2' is not supported \(llama,",
    ),
    "model_type against architectures": (changed(model_type="qwen2"), r"model_type 'qwen2' is not supported"),
    "neither": (changed(architectures=None, model_type=None), r"neither architectures nor model_type"),
    "partial_rotary_factor": (
        changed(partial_rotary_factor=0.5),
        r"partial_rotary_factor 0.5 is not supported",
    ),
    "quantization_config": (
        changed(quantization_config={"quant_method": "awq"}),
        r"quantization_config \{'quant_method': 'awq'\} is not supported \(unquantized weights only\)",
    ),
    "num_key_value_heads": (
        changed(num_key_value_heads=3),
        r"num_key_value_heads 3 is not supported \(a divisor",
    ),
    "dtype": (changed(dtype="float8_e4m3fn"), r"dtype 'float8_e4m3fn' is not supported \(float32, bfloat16"),
    "torch_dtype": (changed(torch_dtype="int8"), r"torch_dtype 'int8' is not supported"),
    "rms_norm_eps": (
        changed(rms_norm_eps="1e-5"),
        r"rms_norm_eps '1e-5' is not supported \(a positive number\)",
    ),
    "yarn factor": (
        changed(rope_parameters={"rope_type": "yarn", "original_max_position_embeddings": 64}),
        r"rope_parameters.factor is missing",
    ),
    "llama3 low_freq_factor": (
        changed(rope_parameters={**LLAMA3, "rope_type": "llama3", "low_freq_factor": None}),
        r"rope_parameters.low_freq_factor None is not supported \(a number\)",
    ),
    "nested rope_parameters": (
        changed(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        r"rope_parameters.full_attention \{.*\} is not supported \(one RoPE block for every layer\)",
    ),
    "layer_types": (
        changed(
            architectures=["Qwen2ForCausalLM"], model_type="qwen2", layer_types=["full_attention", "chunked"]
        ),
        r"layer_types \['full_attention', 'chunked'\] is not supported",
    ),
}


@pytest.mark.parametrize("raw, message", REFUSED.values(), ids=list(REFUSED))
def test_what_the_engine_cannot_run_is_refused_at_load_naming_the_key(
    tmp_path: Path, raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModelLoadError, match=f"^config.json: {message}"):
        load_model(write(tmp_path, raw), torch.float32, torch.device("cpu"))


def test_both_rope_layouts_read_alike(tmp_path: Path) -> None:
    v5 = changed(rope_parameters={**LLAMA3, "rope_type": "llama3", "rope_theta": 5e5})
    legacy = changed(rope_parameters=None, rope_theta=5e5, rope_scaling={**LLAMA3, "rope_type": "llama3"})
    want = RopeConfig("llama3", 5e5, 8.0, 8192, 1.0, 4.0)
    assert parse_config(v5, llama.ARCHITECTURE).rope == want
    assert parse_config(legacy, llama.ARCHITECTURE).rope == want
    # transformers' precedence: rope_scaling over rope_parameters, the block's theta over the top level
    both = {**v5, "rope_theta": 1.0, "rope_scaling": {"type": "linear", "factor": 2.0, "rope_theta": 7.0}}
    assert parse_config(both, llama.ARCHITECTURE).rope == RopeConfig("linear", 7.0, 2.0)
    no_rope = changed(rope_parameters=None)
    assert parse_config(no_rope, llama.ARCHITECTURE).rope == RopeConfig("default", 10000.0)


def test_yarn_reads_transformers_defaults() -> None:
    raw = changed(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6})
    rope = parse_config(raw, llama.ARCHITECTURE).rope
    assert (rope.original_max_position_embeddings, rope.beta_fast, rope.beta_slow, rope.truncate) == (
        4096,
        32,
        1,
        True,
    )
    explicit_null = {**raw, "rope_parameters": {**raw["rope_parameters"], "factor": None}}
    explicit_null["rope_parameters"]["original_max_position_embeddings"] = 1024
    assert parse_config(explicit_null, llama.ARCHITECTURE).rope.factor == 4.0  # 4096 / 1024


def test_architecture_from_architectures_else_model_type() -> None:
    assert resolve({"architectures": ["Unknown", "Qwen3ForCausalLM"]}) is qwen3.ARCHITECTURE
    assert resolve({"model_type": "mistral"}) is mistral.ARCHITECTURE
    assert resolve({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}) is qwen2.ARCHITECTURE


def test_keys_left_out_take_the_architectures_defaults() -> None:
    minimal = {"vocab_size": 8, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1}
    llama_config = parse_config({**minimal, "num_attention_heads": 4}, llama.ARCHITECTURE)
    assert (llama_config.num_key_value_heads, llama_config.head_dim, llama_config.rms_norm_eps) == (
        4,
        16,
        1e-6,
    )
    assert llama_config.max_position_embeddings == 2048 and not llama_config.tie_word_embeddings
    qwen3_config = parse_config({**minimal, "num_attention_heads": 32}, qwen3.ARCHITECTURE)
    assert (qwen3_config.head_dim, qwen3_config.num_key_value_heads) == (128, 32)
    mistral_config = parse_config({**minimal, "num_attention_heads": 32}, mistral.ARCHITECTURE)
    assert (mistral_config.sliding_window, mistral_config.max_position_embeddings) == (4096, 131072)


def test_biases_only_where_the_architecture_reads_them() -> None:
    raw = {**BASE, "attention_bias": True, "mlp_bias": True}
    assert parse_config(raw, llama.ARCHITECTURE).attention_bias
    assert parse_config(raw, llama.ARCHITECTURE).mlp_bias
    assert not parse_config(raw, mistral.ARCHITECTURE).attention_bias  # transformers' Mistral ignores it
    assert not parse_config(raw, qwen2.ARCHITECTURE).mlp_bias


@pytest.mark.parametrize(
    "keys, window",
    [
        ({"use_sliding_window": False, "sliding_window": 64}, None),
        ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}, 64),
        ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}, None),  # no layer slides
        ({"use_sliding_window": True, "sliding_window": None}, None),
        ({"use_sliding_window": True, "sliding_window": 64, "layer_types": ["sliding_attention"] * 2}, 64),
        ({"use_sliding_window": False, "sliding_window": 64, "layer_types": ["sliding_attention"] * 2}, None),
    ],
)
def test_qwen_sliding_window_as_transformers_sets_it(keys: dict[str, Any], window: int | None) -> None:
    assert parse_config({**BASE, **keys}, qwen2.ARCHITECTURE).sliding_window == window
    assert parse_config({**BASE, **keys}, qwen3.ARCHITECTURE).sliding_window == window


def test_a_sliding_window_is_served_only_for_contexts_within_it(tiny_dir: Path, tmp_path: Path) -> None:
    model = Path(shutil.copytree(tiny_dir, tmp_path / "m"))  # a Llama without biases: Mistral's tensors
    raw = {**json.loads((model / "config.json").read_text()), "model_type": "mistral"}
    raw["architectures"] = ["MistralForCausalLM"]
    write(model, {**raw, "sliding_window": 1023})
    with pytest.raises(
        ModelLoadError, match=r"sliding_window 1023 is not supported for a context of 1024 tokens"
    ):
        LLMEngine.from_config(make_config(model))  # model.max_context_tokens 1024
    write(model, {**raw, "sliding_window": 1024})
    engine = LLMEngine.from_config(make_config(model))
    assert engine.max_context == 1024 and read_config(model).sliding_window == 1024


def test_check_context_is_silent_without_a_window() -> None:
    config = parse_config(BASE, llama.ARCHITECTURE)
    check_context(config, 10**6)
    assert config.sliding_window is None
