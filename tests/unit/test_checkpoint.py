"""Checkpoint reading and strict checks: missing / unexpected / misshaped tensors, shards, weight norm."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from higgs_serve.codec.weights import CODEC_PREFIX, expected_codec_tensors
from higgs_serve.errors import CheckpointError
from higgs_serve.model.checkpoint import (
    TALKER_RENAMES,
    fold_weight_norm,
    load_checkpoint,
    read_safetensors,
    resolve_model_dir,
    split_checkpoint,
    to_checkpoint_name,
    to_internal_name,
)
from higgs_serve.model.talker import Talker, talker_tensor_shapes
from higgs_serve.model.tiny import write_tiny_model


@pytest.fixture(scope="module")
def raw(tiny_model_dir):
    return read_safetensors(tiny_model_dir)


def test_load_tiny_checkpoint(tiny_model_dir, tiny_spec):
    ckpt = load_checkpoint(tiny_model_dir, tiny_spec)
    assert set(ckpt.talker) == set(talker_tensor_shapes(tiny_spec.text, tiny_spec.audio))
    assert set(ckpt.codec) == set(expected_codec_tensors(tiny_spec.codec))  # training-only tensors dropped
    talker, codec = ckpt  # unpacks like a tuple
    assert talker is ckpt.talker and codec is ckpt.codec
    Talker(tiny_spec.text, tiny_spec.audio).load_talker_weights(ckpt.talker)


def test_rename_table_round_trips():
    for ck, internal in TALKER_RENAMES:
        ck3, internal3 = ck.replace("{i}", "3"), internal.replace("{i}", "3")
        assert to_internal_name(ck3) == internal3
        assert to_checkpoint_name(internal3) == ck3
    assert to_internal_name("body.layers.0.mlp.extra.weight") is None


def test_missing_talker_tensor_is_named(raw, tiny_spec):
    tensors = dict(raw)
    del tensors["body.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match=r"missing talker tensor body\.layers\.1\.mlp\.up_proj\.weight"):
        split_checkpoint(tensors, tiny_spec)


def test_missing_layer_beyond_config_is_named(raw, tiny_spec):
    tensors = {n: t for n, t in raw.items() if not n.startswith("body.layers.1.")}
    with pytest.raises(CheckpointError, match=r"body\.layers\.1\.input_layernorm\.weight"):
        split_checkpoint(tensors, tiny_spec)


@pytest.mark.parametrize("name", ["body.layers.0.mlp.extra.weight", "body.layers.2.input_layernorm.weight",
                                  "something.else", "tied.head.modality_heads.0.weight"])
def test_unexpected_tensor_is_named(raw, tiny_spec, name):
    tensors = dict(raw)
    tensors[name] = torch.zeros(64)
    with pytest.raises(CheckpointError, match="unexpected tensor " + re.escape(name)):
        split_checkpoint(tensors, tiny_spec)


def test_text_head_is_ignored(raw, tiny_spec):
    tensors = dict(raw)
    tensors["tied.head.text_head.weight"] = torch.zeros(tiny_spec.text.vocab_size, tiny_spec.text.hidden_size)
    talker, _ = split_checkpoint(tensors, tiny_spec)
    assert "text_head.weight" not in talker and len(talker) == len(talker_tensor_shapes(tiny_spec.text, tiny_spec.audio))


def test_untied_audio_head_required_and_loaded(raw, tiny_spec):
    import dataclasses

    spec = dataclasses.replace(tiny_spec, audio=dataclasses.replace(tiny_spec.audio, tie_word_embeddings=False))
    with pytest.raises(CheckpointError, match=r"tied\.head\.modality_heads\.0\.weight"):
        split_checkpoint(dict(raw), spec)
    tensors = dict(raw)
    head = torch.randn(spec.audio.table_rows, spec.text.hidden_size)
    tensors["tied.head.modality_heads.0.weight"] = head
    talker, _ = split_checkpoint(tensors, spec)
    assert torch.equal(talker["audio_head.weight"], head)


def test_misshaped_tensor_is_named(raw, tiny_spec):
    tensors = dict(raw)
    tensors["body.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    with pytest.raises(CheckpointError, match=r"body\.layers\.0\.self_attn\.k_proj\.weight has shape \[16, 64\], "
                                              r"expected \[32, 64\]"):
        split_checkpoint(tensors, tiny_spec)


def test_codec_strictness_names_full_tensor(raw, tiny_spec):
    tensors = dict(raw)
    del tensors[CODEC_PREFIX + "fc2.weight"]
    with pytest.raises(CheckpointError, match=re.escape(CODEC_PREFIX + "fc2.weight")):
        split_checkpoint(tensors, tiny_spec)
    tensors = dict(raw)
    tensors[CODEC_PREFIX + "mystery.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"mystery\.weight"):
        split_checkpoint(tensors, tiny_spec)


def test_sharded_checkpoint_loads_identically(tmp_path, raw, tiny_spec):
    write_tiny_model(tmp_path, seed=0, shards=3)
    assert not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*-of-00003.safetensors"))) == 3
    sharded = read_safetensors(tmp_path)
    assert set(sharded) == set(raw)
    assert all(torch.equal(sharded[n], raw[n]) for n in raw)
    load_checkpoint(tmp_path, tiny_spec)


def test_missing_shard_file_is_named(tmp_path):
    write_tiny_model(tmp_path, seed=0, shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"shard file model-00002-of-00002\.safetensors is missing"):
        read_safetensors(tmp_path)


def test_index_entry_not_in_shard(tmp_path):
    write_tiny_model(tmp_path, seed=0, shards=2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["body.ghost.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"body\.ghost\.weight"):
        read_safetensors(tmp_path)


def test_no_weights_at_all(tmp_path):
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        read_safetensors(tmp_path)


# ---- weight norm -------------------------------------------------------------------------------


def _modules():
    torch.manual_seed(0)
    return {
        "conv": (nn.Conv1d(6, 5, 7), 0),
        "conv_t": (nn.ConvTranspose1d(6, 4, 10, stride=5), 0),
        "pos_conv": (nn.Conv1d(8, 8, 5, groups=2), 2),  # HuBERT's positional conv: weight norm over dim 2
    }


def _randomize_g(module: nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("weight_g", "original0")):
                p.copy_(torch.rand(p.shape) + 0.5)


@pytest.mark.parametrize("kind", ["conv", "conv_t", "pos_conv"])
def test_fold_weight_norm_parametrization_names(kind):
    module, dim = _modules()[kind]
    module = nn.utils.parametrizations.weight_norm(module, dim=dim)
    _randomize_g(module)
    sd = {f"enc.{kind}.{k}": v for k, v in module.state_dict().items()}
    assert f"enc.{kind}.parametrizations.weight.original0" in sd
    folded = fold_weight_norm(sd)
    assert set(folded) == {f"enc.{kind}.weight", f"enc.{kind}.bias"}
    torch.testing.assert_close(folded[f"enc.{kind}.weight"], module.weight.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["conv", "conv_t", "pos_conv"])
def test_fold_weight_norm_old_g_v_names(kind):
    import warnings

    module, dim = _modules()[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates the old API; checkpoints still carry its names
        module = nn.utils.weight_norm(module, dim=dim)
    _randomize_g(module)
    with torch.no_grad():
        module.weight = torch._weight_norm(module.weight_v, module.weight_g, dim)
    sd = {k: v for k, v in module.state_dict().items()}
    assert "weight_g" in sd and "weight_v" in sd
    folded = fold_weight_norm(sd)
    assert set(folded) == {"weight", "bias"}
    torch.testing.assert_close(folded["weight"], module.weight.detach(), rtol=1e-6, atol=1e-7)


def test_fold_weight_norm_unmatched_half_is_named():
    with pytest.raises(CheckpointError, match=r"dec\.conv\.parametrizations\.weight\.original1 has no matching "
                                              r"magnitude"):
        fold_weight_norm({"dec.conv.parametrizations.weight.original1": torch.ones(2, 2, 3)})
    with pytest.raises(CheckpointError, match=r"dec\.conv\.weight_g has no matching direction"):
        fold_weight_norm({"dec.conv.weight_g": torch.ones(2, 1, 1)})


def test_fold_weight_norm_leaves_plain_tensors():
    t = {"a.weight": torch.ones(2), "quantizer.quantizers.0.codebook.embed": torch.zeros(4, 2)}
    assert fold_weight_norm(t) == t


# ---- locating ----------------------------------------------------------------------------------


def test_resolve_existing_dir(tiny_model_dir):
    assert resolve_model_dir(str(tiny_model_dir)) == tiny_model_dir


def test_resolve_missing_local_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nope"))


def test_resolve_hub_id_offline_not_cached(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError, match=r"'bosonai/higgs-audio-v3-tts-4b' is not in the local Hugging Face "
                                              r"cache and this machine cannot download it"):
        resolve_model_dir("bosonai/higgs-audio-v3-tts-4b")
