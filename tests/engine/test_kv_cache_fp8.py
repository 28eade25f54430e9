"""kv_cache_dtype fp8 on CPU (torch reference backend), tiny checkpoint: the engine stores K/V in
float8 e4m3 and still produces audio; teacher-forced, its hidden states and logits stay close to
the float32 cache's.

What "close" means here (measured on the tiny seed-0 checkpoint, 96 prompt tokens + 32 decode
steps): the hidden states move by 1.6% (relative L2; at most 2.7% on one step) and 98.9% of the
(position, codebook) argmaxes agree; the bounds leave ~3x room. Free-running greedy codes are no
measure: the tiny model's logits are nearly flat (random weights), so two runs part at the first
differing code (measured: 15% to 97% of the codes agree, by request).
"""

from __future__ import annotations

import numpy as np
import torch

from engine_harness import TEXTS, ManualEngine, engine_deploy, sampling, speech
from higgs_serve.worker.attention import build_attention_metadata, get_backend

FP8 = torch.float8_e4m3fn


def test_engine_generates_audio_with_an_fp8_kv_cache(tiny_loaded):
    outputs = {}
    for name in ("auto", "fp8"):
        engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, kv_cache_dtype=name))
        try:
            k_cache, v_cache = engine.core.runner.kv_caches[0]
            assert k_cache.dtype == v_cache.dtype == (FP8 if name == "fp8" else torch.float32)
            requests = [speech(f"{name}{i}", text, sampling(temperature=0.0, frames=24, min_frames=24))
                        for i, text in enumerate(TEXTS[:3])]
            outputs[name] = engine.generate(requests)
        finally:
            engine.close()
    for got, ref in zip(outputs["fp8"], outputs["auto"]):
        assert got.error is None and got.rows.shape == ref.rows.shape
        assert got.audio.shape == ref.audio.shape and got.audio.size > 0
        assert np.isfinite(got.audio).all() and np.abs(got.audio).max() > 0


def _teacher_forced(talker, cache_dtype, token_ids, rows):
    """Hidden states [steps, D] of a prompt prefill then one decode step per audio row, with the
    caches in `cache_dtype` (the same inputs whatever the cache holds)."""
    text = talker.text_cfg
    backend = get_backend("torch")
    block_size, prompt, steps = 16, len(token_ids), len(rows)
    table = list(range(-(-(prompt + steps) // block_size)))
    caches = backend.allocate_kv_cache(text.num_layers, len(table), block_size, text.num_kv_heads, text.head_dim,
                                       cache_dtype, "cpu")
    hidden = []
    with torch.inference_mode():
        meta = build_attention_metadata([0], [prompt], [table], block_size)
        hidden.append(talker(talker.embed_text(token_ids), torch.arange(prompt), backend.bind(meta, caches))[-1:])
        for i in range(steps):
            meta = build_attention_metadata([prompt + i], [1], [table], block_size)
            embeds = talker.embed_audio(rows[i : i + 1])
            hidden.append(talker(embeds, torch.tensor([prompt + i]), backend.bind(meta, caches)))
    return torch.cat(hidden)


def test_fp8_cache_hidden_states_and_logits_stay_close_to_fp32(tiny_loaded):
    talker = tiny_loaded.talker
    assert tiny_loaded.dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, talker.text_cfg.vocab_size, (96,), generator=gen)
    rows = torch.randint(0, talker.audio_cfg.codebook_size, (32, talker.audio_cfg.num_codebooks), generator=gen)
    exact = _teacher_forced(talker, torch.float32, token_ids, rows)
    fp8 = _teacher_forced(talker, FP8, token_ids, rows)
    assert fp8.shape == exact.shape and torch.isfinite(fp8).all()
    assert not torch.equal(fp8, exact)  # the cache really was fp8
    relative = ((fp8 - exact).norm() / exact.norm()).item()
    assert relative < 0.05, relative
    logits_exact, logits_fp8 = talker.audio_logits(exact), talker.audio_logits(fp8)
    agree = (logits_fp8.argmax(-1) == logits_exact.argmax(-1)).float().mean().item()
    assert agree > 0.9, agree
