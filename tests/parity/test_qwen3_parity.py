"""Our Qwen3 backbone vs transformers' Qwen3Model (same weights, every norm randomised).

The attention is the dense single-sequence reference from conftest (`dense_attention`), so this
checks the model math only: RMSNorm, q/k-norm, neox RoPE, GQA projections, SwiGLU, final norm.
Also: incremental decoding with a cache equals the full forward, and the fused audio embedding
and head are exactly the formulas of docs/model.md#talker.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3Model

from higgs_serve.model.checkpoint import to_internal_name
from higgs_serve.model.hf_config import AudioConfig, TextConfig
from higgs_serve.model.talker import Talker

TEXT = TextConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                  vocab_size=300, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=8192)


def hf_config(text: TextConfig) -> Qwen3Config:
    return Qwen3Config(hidden_size=text.hidden_size, num_hidden_layers=text.num_layers,
                       num_attention_heads=text.num_heads, num_key_value_heads=text.num_kv_heads,
                       head_dim=text.head_dim, intermediate_size=text.intermediate_size, vocab_size=text.vocab_size,
                       rms_norm_eps=text.rms_norm_eps, rope_theta=text.rope_theta,
                       max_position_embeddings=text.max_position_embeddings, tie_word_embeddings=False,
                       attn_implementation="eager")


@torch.no_grad()
def randomize_qwen3_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """transformers inits norms to exactly 1 (which would hide a missing norm): randomise all."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim == 1:
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
        elif "embed" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model


def internal_tensors(hf_model: Qwen3Model) -> dict[str, torch.Tensor]:
    """transformers names -> real checkpoint names -> our internal names (via the rename table)."""
    out = {}
    for name, t in hf_model.state_dict().items():
        ck = "tied.embedding.text_embedding.weight" if name == "embed_tokens.weight" else "body." + name
        internal = to_internal_name(ck)
        assert internal is not None, ck
        out[internal] = t
    return out


def build_pair(dtype: torch.dtype = torch.float32, audio: AudioConfig = AudioConfig(), seed: int = 0):
    hf = randomize_qwen3_(Qwen3Model(hf_config(TEXT)), seed).to(dtype).eval()
    tensors = internal_tensors(hf)
    g = torch.Generator().manual_seed(seed + 1)
    tensors["audio_embedding.weight"] = torch.randn(audio.table_rows, TEXT.hidden_size, generator=g)
    if not audio.tie_word_embeddings:
        tensors["audio_head.weight"] = torch.randn(audio.table_rows, TEXT.hidden_size, generator=g)
    talker = Talker(TEXT, audio, dtype=dtype)
    talker.load_talker_weights(tensors)
    return hf, talker


@pytest.fixture(scope="module")
def pair():
    return build_pair()


def token_ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TEXT.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("start", [0, 3000])
def test_full_forward_matches_transformers(pair, dense_attention, start):
    hf, talker = pair
    ids = token_ids(13)
    positions = torch.arange(start, start + 13)
    with torch.no_grad():
        ref = hf(input_ids=ids[None], position_ids=positions[None]).last_hidden_state[0]
        ours = talker(talker.embed_text(ids), positions, dense_attention())
    assert ref.abs().max() > 0.5  # a meaningful signal, not near-zero activations
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("chunks", [(7, 1, 1, 1, 1, 1, 1), (4, 4, 4, 1)])
def test_incremental_decoding_matches_full_forward(pair, dense_attention, chunks):
    """Prefill (possibly chunked) then single tokens through a cache == one full forward."""
    hf, talker = pair
    n = sum(chunks)
    ids = token_ids(n, seed=1)
    with torch.no_grad():
        ref = hf(input_ids=ids[None]).last_hidden_state[0]
        attn = dense_attention()
        outs, pos = [], 0
        for c in chunks:
            seg = torch.arange(pos, pos + c)
            outs.append(talker(talker.embed_text(ids[seg]), seg, attn))
            pos += c
    assert (torch.cat(outs) - ref).abs().max().item() <= 1e-4


def test_bf16_close_to_transformers_bf16(dense_attention):
    hf, talker = build_pair(torch.bfloat16)
    ids = token_ids(9, seed=2)
    with torch.no_grad():
        ref = hf(input_ids=ids[None]).last_hidden_state[0].float()
        ours = talker(talker.embed_text(ids), torch.arange(9), dense_attention())
    assert ours.dtype == torch.bfloat16
    # identical math in bf16; only matmul blocking and the fused qkv/gate_up layout may round differently
    assert (ours.float() - ref).abs().max().item() <= 0.05 * ref.abs().max().item()


def test_audio_embedding_is_the_sum_over_codebooks(pair):
    _, talker = pair
    rows = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [1024] * 8, [1023, 1025, 5, 1024, 1024, 1024, 1024, 1024]])
    w = talker.audio_embedding
    expected = torch.stack([sum(w[q * 1026 + int(r[q])] for q in range(8)) for r in rows])
    torch.testing.assert_close(talker.embed_audio(rows), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_audio_logits_use_the_tied_or_untied_head(tied):
    _, talker = build_pair(audio=AudioConfig(tie_word_embeddings=tied))
    h = torch.randn(3, TEXT.hidden_size)
    head = talker.audio_embedding if tied else talker.audio_head
    logits = talker.audio_logits(h)
    assert logits.shape == (3, 8, 1026) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, (h @ head.T).view(3, 8, 1026))
    if not tied:
        assert not torch.allclose(logits, (h @ talker.audio_embedding.T).view(3, 8, 1026))
