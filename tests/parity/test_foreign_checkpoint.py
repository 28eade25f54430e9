"""A checkpoint built WITHOUT our writer loads, and reproduces the transformers models it came from.

Talker: a transformers `Qwen3Model` state_dict renamed to the real Higgs names (docs/model.md#checkpoint-layout), plus
a text head (ignored) and a random fused audio table. Codec: a transformers
`HiggsAudioV2TokenizerModel` with weight norm applied (parametrization names; one conv converted to
the old `weight_g`/`weight_v` style), with its training-only buffers, under the codec prefix.
The tokenizer is trained here with the special tokens added after training, in a different order
and without `<|ref_text|>`, so lookups by name are exercised. Config dicts come from transformers'
own `to_dict()` (full of keys we ignore). Sharded into 2 files with an index.
"""

from __future__ import annotations

import copy

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import Qwen3Config, Qwen3Model

from support.hf_reference import (
    build_reference,
    import_higgs_tokenizer_model,
    randomize_,
    reference_codec_tensors,
)

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.weights import CODEC_PREFIX, expected_codec_tensors
from higgs_serve.model.checkpoint import load_checkpoint
from higgs_serve.model.hf_config import load_model_spec
from higgs_serve.model.prompt import PromptBuilder
from higgs_serve.model.talker import Talker

SPECIALS = ["<|endoftext|>", "<|audio|>", "<|text|>", "<|tts|>", "<|ref_audio|>"]


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 4 + ["hello world again"] * 4,
                            trainer=trainer)
    tok.add_special_tokens(SPECIALS)  # ids at the end of the vocabulary, not 0..5
    return tok


@torch.no_grad()
def _qwen3(vocab_size: int) -> Qwen3Model:
    cfg = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=96, vocab_size=vocab_size, rope_theta=1e6,
                      max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="eager")
    model = Qwen3Model(cfg).eval()
    g = torch.Generator().manual_seed(7)
    for name, p in model.named_parameters():
        scale = 1.0 if "embed" in name else (0.3 if p.ndim == 1 else p.shape[1] ** -0.5)
        p.copy_((1.0 if p.ndim == 1 else 0.0) + scale * torch.randn(p.shape, generator=g))
    return model


def _write_sharded(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, group in halves.items():
        save_file({n: tensors[n].contiguous().clone() for n in group}, str(directory / fname))
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    directory = tmp_path_factory.mktemp("foreign")
    tok = _tokenizer()
    tok.save(str(directory / "tokenizer.json"))
    qwen = _qwen3(tok.get_vocab_size())

    codec_cfg_cls, _ = import_higgs_tokenizer_model()
    codec = build_reference(CodecConfig.tiny().to_hf_dict())
    codec.apply_weight_norm()
    randomize_(codec, seed=3)
    codec_sd = {k: v.detach().clone() for k, v in codec.state_dict().items()}
    assert any(".parametrizations.weight.original0" in k for k in codec_sd)
    for role, old in (("0", "g"), ("1", "v")):  # one conv in the old weight_g / weight_v naming
        codec_sd[f"acoustic_decoder.conv1.weight_{old}"] = codec_sd.pop(
            f"acoustic_decoder.conv1.parametrizations.weight.original{role}")
    folded_reference = reference_codec_tensors(codec)  # removes the parametrizations in place

    g = torch.Generator().manual_seed(11)
    audio_table = torch.randn(8 * 1026, 64, generator=g) * 0.25
    tensors = {"tied.embedding.text_embedding.weight": qwen.embed_tokens.weight.detach(),
               "tied.head.text_head.weight": torch.randn(tok.get_vocab_size(), 64, generator=g),
               "tied.embedding.modality_embeddings.0.embedding.weight": audio_table}
    tensors.update({"body." + k: v for k, v in qwen.state_dict().items() if k != "embed_tokens.weight"})
    tensors.update({CODEC_PREFIX + k: v for k, v in codec_sd.items()})
    _write_sharded(directory, tensors)

    config = {
        "model_type": "higgs_multimodal_qwen3",
        "architectures": ["HiggsMultimodalQwen3ForConditionalGeneration"],
        "dtype": "float32",
        "text_config": qwen.config.to_dict(),
        "audio_encoder_config": {"encoder_type": "discrete", "num_codebooks": 8, "vocab_size": 1026,
                                 "tie_word_embeddings": True},
        "audio_tokenizer_config": codec_cfg_cls(**CodecConfig.tiny().to_hf_dict()).to_dict(),
    }
    (directory / "config.json").write_text(json.dumps(config, default=str))
    return directory, qwen, codec, folded_reference, audio_table, tok


@pytest.fixture(scope="module")
def loaded(foreign):
    spec = load_model_spec(foreign[0])
    return spec, load_checkpoint(foreign[0], spec)


def test_spec_and_prompt_from_foreign_files(foreign):
    directory, qwen, _, _, _, tok = foreign
    spec = load_model_spec(directory)
    assert spec.text.num_layers == 2 and spec.text.intermediate_size == 96 and spec.text.rope_theta == 1e6
    assert spec.text.vocab_size == tok.get_vocab_size() and spec.codec == CodecConfig.tiny()
    pb = PromptBuilder.from_dir(directory)
    assert (pb.tts_id, pb.text_id, pb.audio_id) == tuple(tok.token_to_id(n) for n in ("<|tts|>", "<|text|>",
                                                                                      "<|audio|>"))
    assert pb.ref_text_id is None and pb.eos_id == tok.token_to_id("<|endoftext|>")


def test_talker_matches_transformers(foreign, loaded, dense_attention):
    directory, qwen, _, _, audio_table, _ = foreign
    spec, ckpt = loaded
    talker = Talker(spec.text, spec.audio)
    talker.load_talker_weights(ckpt.talker)
    ids = torch.tensor(PromptBuilder.from_dir(directory).zero_shot("the quick brown fox"))
    rows = torch.tensor([[5, 1024, 1024, 1024, 1024, 1024, 1024, 1024],
                         [17, 900, 1024, 1024, 1024, 1024, 1024, 1024]])
    audio_embeds = torch.stack([sum(audio_table[q * 1026 + int(r[q])] for q in range(8)) for r in rows])
    n = len(ids)
    with torch.no_grad():
        embeds = torch.cat([qwen.embed_tokens(ids), audio_embeds])
        ref = qwen(inputs_embeds=embeds[None]).last_hidden_state[0]
        attn = dense_attention()
        prefill = talker(talker.embed_text(ids), torch.arange(n), attn)
        steps = [talker(talker.embed_audio(rows[i:i + 1]), torch.tensor([n + i]), attn) for i in range(2)]
        ours = torch.cat([prefill, *steps])
        logits = talker.audio_logits(ours[-1:])
    assert (ours - ref).abs().max().item() <= 1e-4
    torch.testing.assert_close(logits[0], (ref[-1] @ audio_table.T).view(8, 1026), rtol=1e-4, atol=1e-4)


def test_codec_tensors_are_folded_and_complete(foreign, loaded):
    folded_reference = foreign[3]
    spec, (_, codec) = loaded
    assert set(codec) == set(expected_codec_tensors(spec.codec))
    for name, t in codec.items():
        torch.testing.assert_close(t, folded_reference[name], rtol=1e-5, atol=1e-6, msg=name)


def test_codec_decode_matches_transformers(foreign, loaded):
    from higgs_serve.codec.decoder import CodecDecoder

    reference = copy.deepcopy(foreign[2]).double()
    spec, ckpt = loaded
    decoder = CodecDecoder(spec.codec)
    decoder.load_state(ckpt.codec)
    decoder64 = CodecDecoder(spec.codec).double()
    decoder64.load_state(ckpt.codec)
    codes = torch.randint(0, 1024, (1, 6, 8), generator=torch.Generator().manual_seed(5))  # [B, T, 8]
    with torch.no_grad():
        ours = decoder.eval()(codes).double()
        ours64 = decoder64.eval()(codes)
        ref = reference.decode(codes.transpose(1, 2)).audio_values[:, 0]
    assert ours.shape == ours64.shape == ref.shape == (1, 6 * 960)
    peak = ref.abs().max().item()
    # the same function (the codes' lookup is folded into one table here,
    # docs/model.md#codec-geometry): in float64 they differ only by the weights, which the loader
    # folds (weight norm) in float32
    assert (ours64 - ref).abs().max().item() <= 5e-5 * peak
    # float32 against that: this random-weight decoder amplifies float32 rounding to about 1e-4
    # of peak (for transformers' own float32 decode as well)
    assert (ours - ref).abs().max().item() <= 2e-4 * peak
