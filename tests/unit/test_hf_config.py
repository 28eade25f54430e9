"""config.json parsing: the rope_theta rule, encoder_type, missing keys, wrong types, cross checks."""

from __future__ import annotations

import copy
import json

import pytest

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.errors import ConfigError
from higgs_serve.model.hf_config import (
    AudioConfig,
    ModelSpec,
    TextConfig,
    load_model_spec,
    parse_model_spec,
    spec_to_config_dict,
)

WHERE = "/models/x/config.json"


def _tiny_dict() -> dict:
    spec = ModelSpec(text=TextConfig.preset_tiny(500), audio=AudioConfig(), codec=CodecConfig.tiny())
    return spec_to_config_dict(spec)


def _with(path: str, value, d: dict | None = None) -> dict:
    """A copy of the tiny dict with d[a][b] = value (value `...` deletes the key)."""
    d = copy.deepcopy(d or _tiny_dict())
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return d


def test_round_trip_tiny_and_4b():
    d = _tiny_dict()
    spec = parse_model_spec(d, WHERE)
    assert spec_to_config_dict(spec) == d
    assert spec.codec == CodecConfig.tiny()
    spec4b = ModelSpec(text=TextConfig.preset_4b(), audio=AudioConfig())
    parsed = parse_model_spec(spec_to_config_dict(spec4b, include_codec=False), WHERE)
    assert parsed == spec4b
    assert parsed.codec == CodecConfig()  # no audio_tokenizer_config -> Higgs v2 defaults


def test_4b_preset_numbers():
    t = TextConfig.preset_4b()
    assert (t.hidden_size, t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim) == (2560, 36, 32, 8, 128)
    assert (t.intermediate_size, t.vocab_size, t.rms_norm_eps, t.rope_theta) == (9728, 151936, 1e-6, 1e6)
    assert (t.q_size, t.kv_size) == (4096, 1024)
    a = AudioConfig()
    assert (a.boc, a.eoc, a.table_rows) == (1024, 1025, 8208)


@pytest.mark.parametrize("value", [..., None])
def test_rope_theta_missing_or_null_is_1e6(value):
    assert parse_model_spec(_with("text_config.rope_theta", value), WHERE).text.rope_theta == 1_000_000.0


def test_rope_theta_explicit_and_transformers5_rope_parameters():
    assert parse_model_spec(_with("text_config.rope_theta", 10000), WHERE).text.rope_theta == 10000.0
    d = _with("text_config.rope_theta", ...)
    d["text_config"]["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "default"}
    assert parse_model_spec(d, WHERE).text.rope_theta == 5e5


def test_rope_scaling_variant_rejected():
    d = _tiny_dict()
    d["text_config"]["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ConfigError, match=r"config\.json.*rope_scaling\.rope_type"):
        parse_model_spec(d, WHERE)


def test_bad_encoder_type():
    with pytest.raises(ConfigError, match=r"/models/x/config\.json.*audio_encoder_config\.encoder_type.*'continuous'"):
        parse_model_spec(_with("audio_encoder_config.encoder_type", "continuous"), WHERE)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                 "vocab_size"])
def test_missing_required_text_key(key):
    with pytest.raises(ConfigError, match=rf"config\.json: text_config\.{key} is required"):
        parse_model_spec(_with(f"text_config.{key}", ...), WHERE)


def test_missing_text_config():
    with pytest.raises(ConfigError, match=r"config\.json\.text_config is required"):
        parse_model_spec(_with("text_config", ...), WHERE)


def test_optional_text_keys_take_qwen3_defaults():
    d = _tiny_dict()
    for key in ("num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings"):
        del d["text_config"][key]
    t = parse_model_spec(d, WHERE).text
    assert (t.num_kv_heads, t.head_dim, t.rms_norm_eps, t.max_position_embeddings) == (4, 128, 1e-6, 32768)
    assert t.tie_word_embeddings is False


def test_missing_audio_encoder_config_uses_defaults():
    assert parse_model_spec(_with("audio_encoder_config", ...), WHERE).audio == AudioConfig()


@pytest.mark.parametrize("path,value", [
    ("text_config.num_hidden_layers", "2"),
    ("text_config.hidden_size", 64.0),
    ("text_config.hidden_size", True),
    ("text_config.rms_norm_eps", "1e-6"),
    ("text_config.tie_word_embeddings", "yes"),
    ("audio_encoder_config.num_codebooks", 8.5),
    ("audio_encoder_config.tie_word_embeddings", 1),
])
def test_wrong_types(path, value):
    key = path.split(".")[-1]
    with pytest.raises(ConfigError, match=rf"config\.json.*{key}"):
        parse_model_spec(_with(path, value), WHERE)


@pytest.mark.parametrize("path,value,match", [
    ("text_config.num_key_value_heads", 3, "num_key_value_heads"),
    ("text_config.hidden_size", 0, "hidden_size"),
    ("text_config.hidden_act", "gelu", "hidden_act"),
    ("text_config.model_type", "llama", "model_type"),
    ("model_type", "qwen3", "model_type"),
    ("torch_dtype", "int8", "torch_dtype"),
    ("audio_encoder_config.out_dim", 32, "out_dim"),
    ("audio_encoder_config.vocab_size", 2050, "vocab_size"),
    ("audio_encoder_config.num_codebooks", 4, "num_codebooks"),
])
def test_invalid_values(path, value, match):
    with pytest.raises(ConfigError, match=match):
        parse_model_spec(_with(path, value), WHERE)


def test_out_dim_equal_to_hidden_is_accepted():
    assert parse_model_spec(_with("audio_encoder_config.out_dim", 64), WHERE).audio_dim == 64


def test_codec_errors_name_the_file():
    d = _tiny_dict()
    d["audio_tokenizer_config"]["sample_rate"] = 16000
    with pytest.raises(ConfigError, match=r"config\.json: audio_tokenizer_config.*sample_rate"):
        parse_model_spec(d, WHERE)


def test_load_model_spec_from_file(tmp_path):
    with pytest.raises(ConfigError, match="config.json not found"):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=str(tmp_path)):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_with("text_config.vocab_size", ...)))
    with pytest.raises(ConfigError, match=rf"{tmp_path}/config\.json: text_config\.vocab_size"):
        load_model_spec(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_tiny_dict()))
    assert load_model_spec(tmp_path).text == TextConfig.preset_tiny(500)


def test_dtype_key_of_transformers5():
    d = _with("torch_dtype", ...)
    d["dtype"] = "float32"
    assert parse_model_spec(d, WHERE).torch_dtype == "float32"
    d["torch_dtype"] = None
    assert parse_model_spec(d, WHERE).torch_dtype == "float32"
    assert parse_model_spec(_with("torch_dtype", ...), WHERE).torch_dtype == "bfloat16"
