"""The tiny checkpoint writer and the dummy-weight builder."""

from __future__ import annotations

import json
import time

import torch

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.weights import CODEC_PREFIX, expected_codec_tensors
from higgs_serve.model.checkpoint import expected_talker_checkpoint_shapes, load_checkpoint, read_safetensors
from higgs_serve.model.hf_config import TextConfig, load_model_spec
from higgs_serve.model.prompt import PromptBuilder
from higgs_serve.model.talker import Talker, talker_tensor_shapes
from higgs_serve.model.tiny import build_dummy_tensors, write_tiny_model

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")


def test_writer_is_deterministic_per_seed(tmp_path, tiny_model_dir):
    write_tiny_model(tmp_path / "a", seed=0)
    write_tiny_model(tmp_path / "b", seed=1)
    for f in FILES:
        assert (tmp_path / "a" / f).read_bytes() == (tiny_model_dir / f).read_bytes(), f
    a, b = read_safetensors(tmp_path / "a"), read_safetensors(tmp_path / "b")
    assert not torch.equal(a["body.layers.0.mlp.up_proj.weight"], b["body.layers.0.mlp.up_proj.weight"])


def test_tiny_layout_is_the_real_one(tiny_model_dir, tiny_spec):
    raw = read_safetensors(tiny_model_dir)
    talker_names = set(expected_talker_checkpoint_shapes(tiny_spec))
    codec_names = {CODEC_PREFIX + n for n in expected_codec_tensors(tiny_spec.codec)}
    extra = set(raw) - talker_names - codec_names
    assert talker_names | codec_names <= set(raw)
    assert extra and all(".codebook." in n for n in extra)  # training-only tensors, ignored by the loader
    assert "tied.embedding.text_embedding.weight" in raw and "body.norm.weight" in raw
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "higgs_multimodal_qwen3"
    assert config["audio_tokenizer_config"] == CodecConfig.tiny().to_hf_dict()
    assert tiny_spec.text.vocab_size == PromptBuilder.from_dir(tiny_model_dir).vocab_size


def test_tiny_talker_runs_fast_and_finite(tiny_model_dir, tiny_spec, dense_attention):
    talker = Talker(tiny_spec.text, tiny_spec.audio)
    talker.load_talker_weights(load_checkpoint(tiny_model_dir, tiny_spec).talker)
    ids = PromptBuilder.from_dir(tiny_model_dir).zero_shot("The cat reads the morning news.")
    attn = dense_attention()
    with torch.inference_mode():
        h = talker(talker.embed_text(torch.tensor(ids)), torch.arange(len(ids)), attn)
        logits = talker.audio_logits(h[-1:])
        rows = torch.full((1, 8), tiny_spec.audio.boc, dtype=torch.int64)
        t0 = time.perf_counter()
        for step in range(5):
            h = talker(talker.embed_audio(rows), torch.tensor([len(ids) + step]), attn)
        per_step = (time.perf_counter() - t0) / 5
    assert logits.shape == (1, 8, 1026) and logits.dtype == torch.float32 and torch.isfinite(logits).all()
    probs = logits.softmax(-1).max(-1).values
    assert (probs < 0.9).all() and (probs > 2 / 1026).all()  # neither greedy nor uniform
    assert per_step < 0.5


def test_4b_config_only(tmp_path):
    write_tiny_model(tmp_path, preset="4b", config_only=True)
    assert not (tmp_path / "model.safetensors").exists()
    assert "audio_tokenizer_config" not in json.loads((tmp_path / "config.json").read_text())
    spec = load_model_spec(tmp_path)
    assert spec.text == TextConfig.preset_4b() and spec.codec == CodecConfig()
    assert spec.torch_dtype == "bfloat16"
    PromptBuilder.from_dir(tmp_path)


def test_dummy_tensors_match_the_layout(tiny_spec):
    talker, codec = build_dummy_tensors(tiny_spec, dtype=torch.bfloat16, device="cpu", seed=3)
    shapes = talker_tensor_shapes(tiny_spec.text, tiny_spec.audio)
    assert {n: tuple(t.shape) for n, t in talker.items()} == shapes
    assert all(t.dtype == torch.bfloat16 for t in talker.values())
    assert {n: tuple(t.shape) for n, t in codec.items()} == expected_codec_tensors(tiny_spec.codec)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in codec.values())
    assert all(codec[n].min() > 0 for n in codec if n.endswith(".alpha"))
    norm = talker["layers.0.input_norm.weight"].float()
    assert (norm - 1).abs().max() < 0.6 and norm.std() > 0.01
    again = build_dummy_tensors(tiny_spec, dtype=torch.bfloat16, device="cpu", seed=3)
    assert all(torch.equal(talker[n], again.talker[n]) for n in talker)
    Talker(tiny_spec.text, tiny_spec.audio, dtype=torch.bfloat16).load_talker_weights(talker)


def test_tiny_codec_weights_give_audio_range_output(tiny_model_dir, tiny_spec):
    from higgs_serve.codec.decoder import CodecDecoder

    decoder = CodecDecoder(tiny_spec.codec)
    decoder.load_state(load_checkpoint(tiny_model_dir, tiny_spec).codec)
    codes = torch.randint(0, 1024, (1, 10, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        audio = decoder.eval()(codes)
    assert audio.shape == (1, 9600) and torch.isfinite(audio).all()
    assert 0.01 < audio.std() < 0.5 and audio.abs().max() < 1.0
