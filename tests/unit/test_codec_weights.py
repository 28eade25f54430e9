"""CodecConfig parsing and the codec tensor layout, checked against transformers' real model."""

from __future__ import annotations

import importlib

import pytest
import torch

from support.hf_reference import build_reference, import_higgs_tokenizer_model, reference_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig, SemanticModelConfig
from higgs_serve.codec.weights import (
    CODEC_PREFIX,
    expected_codec_tensors,
    expected_decoder_tensors,
    expected_encoder_tensors,
    is_ignored_codec_tensor,
    load_codec_tensors,
)
from higgs_serve.errors import CheckpointError, ConfigError

WHERE = "/m/config.json"


@pytest.fixture(scope="module")
def tiny_tensors() -> dict[str, torch.Tensor]:
    return reference_codec_tensors(build_reference(CodecConfig.tiny().to_hf_dict()))


# ---------------- CodecConfig ----------------

def test_default_geometry_matches_higgs_v2():
    cfg = CodecConfig.from_hf_dict(None, WHERE)
    assert cfg == CodecConfig()
    assert (cfg.hop_length, cfg.frame_rate, cfg.num_quantizers) == (960, 25, 8)
    assert (cfg.hidden_size, cfg.semantic_downsample_factor) == (1024, 2)
    assert cfg.semantic.num_hidden_states == 13
    tiny = CodecConfig.tiny()
    tiny.validate("tiny")
    assert (tiny.hop_length, tiny.num_quantizers, tiny.hidden_size) == (960, 8, 32)


@pytest.mark.parametrize("cfg", [CodecConfig.tiny(), CodecConfig()], ids=["tiny", "default"])
def test_hf_dict_round_trips_through_transformers(cfg):
    config_cls, _ = import_higgs_tokenizer_model()
    hf = config_cls(**cfg.to_hf_dict())
    assert hf.hop_length == cfg.hop_length and hf.num_quantizers == cfg.num_quantizers
    assert hf.hidden_size == cfg.hidden_size
    assert list(hf.acoustic_model_config.upsampling_ratios) == list(cfg.upsampling_ratios)
    assert CodecConfig.from_hf_dict(hf.to_dict(), WHERE) == cfg  # what save_pretrained would write
    assert CodecConfig.from_hf_dict(cfg.to_hf_dict(), WHERE) == cfg


def test_partial_dict_merges_over_higgs_defaults():
    cfg = CodecConfig.from_hf_dict(
        {"codebook_dim": 8, "acoustic_model_config": {"hidden_size": 16},
         "semantic_model_config": {"num_hidden_layers": 2, "vocab_size": 99}}, WHERE)
    assert cfg.codebook_dim == 8 and cfg.latent_dim == 16 and cfg.semantic.num_hidden_layers == 2
    assert cfg.downsampling_ratios == (8, 5, 4, 2, 3)  # Higgs v2, not transformers' [8, 5, 4, 2]
    assert cfg.semantic == SemanticModelConfig(num_hidden_layers=2)


@pytest.mark.parametrize(
    "d, key",
    [
        ({"acoustic_model_config": {"downsampling_ratios": [8, 5, 4, 2]}}, "downsampling_ratios"),
        ({"acoustic_model_config": {"upsampling_ratios": [8, 5, 4, 2, 2]}}, "upsampling_ratios"),
        ({"codebook_size": "1024"}, "codebook_size"),
        ({"codebook_size": 1000}, "codebook_size"),
        ({"target_bandwidths": [0.1]}, "target_bandwidths"),
        ({"semantic_model_config": {"do_stable_layer_norm": True}}, "do_stable_layer_norm"),
        ({"semantic_model_config": {"feat_extract_norm": "layer"}}, "feat_extract_norm"),
        ({"semantic_model_config": {"num_attention_heads": 7}}, "num_attention_heads"),
        ({"semantic_model_config": {"conv_stride": [5, 2, 2, 2, 2, 2]}}, "conv_stride"),
        ({"sample_rate": 16000}, "sample_rate"),
        ({"acoustic_model_config": [1]}, "acoustic_model_config"),
    ],
)
def test_invalid_config_names_key_and_file(d, key):
    with pytest.raises(ConfigError) as err:
        CodecConfig.from_hf_dict(d, WHERE)
    assert key in str(err.value) and WHERE in str(err.value)


# ---------------- tensor layout vs transformers ----------------

def _check_layout(cfg: CodecConfig, state: dict[str, torch.Tensor]) -> None:
    expected = expected_codec_tensors(cfg)
    got = {k: tuple(v.shape) for k, v in state.items()}
    assert {k for k in got if not is_ignored_codec_tensor(k)} == set(expected)
    assert {k: got[k] for k in expected} == expected
    # every ignored name transformers produces is training-only
    ignored = {k for k in got if is_ignored_codec_tensor(k)}
    assert all(k.startswith(("decoder_semantic.", "fc1.")) or ".codebook." in k for k in ignored)
    assert set(expected_decoder_tensors(cfg)) | set(expected_encoder_tensors(cfg)) == set(expected)


def test_tiny_layout_matches_transformers(tiny_tensors):
    _check_layout(CodecConfig.tiny(), tiny_tensors)


def test_default_layout_matches_transformers_on_meta():
    cfg = CodecConfig()
    state = reference_codec_tensors(build_reference(cfg.to_hf_dict(), device="meta"))
    _check_layout(cfg, state)
    assert expected_codec_tensors(cfg)["acoustic_decoder.block.1.conv_t1.weight"] == (512, 256, 10)
    assert expected_codec_tensors(cfg)["semantic_model.encoder.pos_conv_embed.conv.weight"] == (768, 48, 128)


def test_fold_weight_norm_gives_expected_names():
    """With the owner's fold_weight_norm (model/checkpoint.py), a weight-normed checkpoint folds to our layout."""
    try:
        checkpoint = importlib.import_module("higgs_serve.model.checkpoint")
    except ImportError:
        pytest.skip("higgs_serve.model.checkpoint not written yet")
    fold = getattr(checkpoint, "fold_weight_norm", None)
    if fold is None:
        pytest.skip("fold_weight_norm not written yet")
    cfg = CodecConfig.tiny()
    model = build_reference(cfg.to_hf_dict())
    model.apply_weight_norm()  # acoustic convs get parametrizations like the shipped checkpoint
    raw = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert any(k.endswith("original1") for k in raw)
    folded = fold(raw)
    _check_layout(cfg, folded)
    plain = reference_codec_tensors(model)
    for k in expected_codec_tensors(cfg):
        torch.testing.assert_close(folded[k], plain[k], rtol=1e-6, atol=1e-6)


# ---------------- strict loading ----------------

def test_load_accepts_and_drops_training_tensors(tiny_tensors):
    cfg = CodecConfig.tiny()
    out = load_codec_tensors(cfg, tiny_tensors, WHERE)
    assert set(out) == set(expected_codec_tensors(cfg))
    extra = dict(tiny_tensors, **{"semantic_model.masked_spec_embed": torch.zeros(16)})
    assert set(load_codec_tensors(cfg, extra, WHERE)) == set(out)


def test_load_missing_tensor_names_it(tiny_tensors):
    tensors = dict(tiny_tensors)
    del tensors["acoustic_decoder.block.2.conv_t1.weight"]
    with pytest.raises(CheckpointError) as err:
        load_codec_tensors(CodecConfig.tiny(), tensors, WHERE)
    assert CODEC_PREFIX + "acoustic_decoder.block.2.conv_t1.weight" in str(err.value)
    assert WHERE in str(err.value) and "missing" in str(err.value)


def test_load_wrong_shape_names_it(tiny_tensors):
    tensors = dict(tiny_tensors, **{"fc2.weight": torch.zeros(16, 31)})
    with pytest.raises(CheckpointError) as err:
        load_codec_tensors(CodecConfig.tiny(), tensors, WHERE)
    assert CODEC_PREFIX + "fc2.weight" in str(err.value) and "[16, 31]" in str(err.value)


def test_load_unknown_tensor_names_it(tiny_tensors):
    tensors = dict(tiny_tensors, **{"acoustic_decoder.block.0.conv_t1.weight_v": torch.zeros(1)})
    with pytest.raises(CheckpointError) as err:
        load_codec_tensors(CodecConfig.tiny(), tensors, WHERE)
    assert CODEC_PREFIX + "acoustic_decoder.block.0.conv_t1.weight_v" in str(err.value)
    assert "unexpected" in str(err.value)
