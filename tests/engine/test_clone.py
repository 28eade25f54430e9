"""Issue 5: voice cloning through the engine on the tiny model (docs/model.md: Prompt layout,
Talker, Delay pattern, Codec geometry).

(a) Teacher-forced check: the engine's greedy rows for a clone prompt equal a plain reference loop
    on our Talker with dense causal attention (tests/conftest.py), whose prompt embeddings at the P positions are
    embed_audio(apply_delay(codes)) and whose rows are the argmax under the delay-pattern masks. A token
    budget of 8 splits the prefill, with chunk boundaries inside the placeholder span.
(b) Prefix cache: a voice's reference blocks are reused by its next request, never by another
    voice with token-identical prompts.
(c) The encoder cache: the second encode of the same audio is a hit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.model.delay_pattern import apply_delay
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.voices.reference_encoder import ReferenceEncoder, reference_audio
from higgs_serve.worker.audio_state import AudioState

from engine_harness import ManualEngine, engine_deploy, sampling

SR = 24000
REF_TEXT = "The cat sat on the mat."
TEXT = "Hello there."
OTHER_TEXT = "A small dog walks past the robot."


def _clip(seed: int, seconds: float = 1.0) -> np.ndarray:
    """A voiced-looking test clip: a few harmonics plus a little noise, [n] float32 at 24 kHz."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    f0 = 120.0 + 40.0 * seed
    audio = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 5)) * 0.2
    return (audio + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def encoder(tiny_loaded):
    return ReferenceEncoder.from_loaded(tiny_loaded)


@pytest.fixture(scope="module")
def voices(encoder):
    """Two different voices of the same length (so their clone prompts are token-identical)."""
    codes_a = encoder.encode(_clip(0), SR)
    codes_b = encoder.encode(_clip(1), SR)
    assert codes_a.shape == codes_b.shape == (25, 8) and not np.array_equal(codes_a, codes_b)
    return codes_a, codes_b


class PlanRecorder:
    """Records every StepPlan the engine hands its runner."""

    def __init__(self, engine: ManualEngine):
        self.plans = []
        launch = engine.core.runner.launch

        def recording(plan):
            self.plans.append(plan)
            return launch(plan)

        engine.core.runner.launch = recording


# ---------------------------------------------------------------------------- (a)
@torch.no_grad()
def _reference_rows(attention, talker, prompt_ids, ph_start, ref_rows, engine_rows, max_frames, min_frames):
    """Greedy rows of a plain loop, teacher-forced with the engine's rows as the next inputs."""
    embeds = talker.embed_text(torch.tensor(prompt_ids))
    embeds[ph_start : ph_start + len(ref_rows)] = talker.embed_audio(torch.as_tensor(ref_rows))
    hidden = talker(embeds, torch.arange(len(prompt_ids)), attention)[-1:]
    state = AudioState(max_slots=1)
    state.add(0, SamplingParams(temperature=0.0, seed=0), max_frames, min_frames)
    slot = torch.tensor([0])
    rows = []
    for t in range(len(engine_rows)):
        logits = talker.audio_logits(hidden)  # [1, 8, V]
        row = logits.masked_fill(~state.masks(slot), float("-inf")).argmax(-1)  # [1, 8]
        forced = torch.full_like(logits, -1e9).scatter_(-1, row[..., None], 0.0)
        stepped, _ = state.step(slot, forced)  # advance delay/ramp state with our choice
        assert torch.equal(stepped, row)
        rows.append(row[0].tolist())
        fed = torch.as_tensor(engine_rows[t : t + 1], dtype=torch.int64)
        hidden = talker(talker.embed_audio(fed), torch.tensor([len(prompt_ids) + t]), attention)
    return np.asarray(rows, dtype=np.int64)


def test_teacher_forced_clone_with_chunk_split_inside_placeholders(tiny_loaded, voices, dense_attention):
    codes, _ = voices
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=2, max_num_batched_tokens=8))
    recorder = PlanRecorder(engine)
    try:
        params = sampling(temperature=0.0, frames=16)
        (out,) = engine.generate([SpeechRequest("clone", TEXT, params, stream=False,
                                                reference=reference_audio(codes, REF_TEXT))])
    finally:
        engine.close()

    # the prompt is the clone layout of docs/model.md#prompt-layout, its P rows the delayed reference codes
    prompts = tiny_loaded.prompts
    ref_rows = apply_delay(codes)  # [T + 7, 8]
    ph_start = 3 + len(prompts.tok(REF_TEXT))
    expected_prompt = ([prompts.tts_id, prompts.ref_text_id, *prompts.tok(REF_TEXT), prompts.ref_audio_id]
                       + [prompts.tts_id] * len(ref_rows)
                       + [prompts.text_id, *prompts.tok(TEXT), prompts.audio_id])
    (new,) = [n for plan in recorder.plans for n in plan.new_requests]
    assert list(new.prompt_token_ids) == expected_prompt
    assert new.placeholder_start == ph_start
    np.testing.assert_array_equal(np.asarray(new.placeholder_rows), ref_rows)

    # chunked prefill really split the placeholder span
    ph_end = ph_start + len(ref_rows)
    prefill = [(c.start_pos, c.num_tokens) for plan in recorder.plans for c in plan.chunks
               if c.start_pos < len(expected_prompt)]
    boundaries = [start + count for start, count in prefill[:-1]]
    assert len(prefill) >= 4 and sum(count for _, count in prefill) == len(expected_prompt)
    assert [b for b in boundaries if ph_start < b < ph_end], (boundaries, ph_start, ph_end)

    assert out.finish_reason in ("stop", "length") and len(out.rows) >= 9
    expected = _reference_rows(dense_attention(), tiny_loaded.talker, expected_prompt, ph_start, ref_rows, out.rows,
                               new.max_frames, new.min_frames)
    np.testing.assert_array_equal(out.rows, expected)


# ---------------------------------------------------------------------------- (b)
def _run_one(engine: ManualEngine, request_id: str, text: str, codes: np.ndarray):
    before = engine.kv.prefix_cache_hits
    (out,) = engine.generate([SpeechRequest(request_id, text, sampling(temperature=0.0, frames=12),
                                            stream=False, reference=reference_audio(codes))])
    return out, engine.kv.prefix_cache_hits - before


def test_prefix_cache_reuses_a_voice_and_never_shares_between_voices(tiny_loaded, voices):
    codes_a, codes_b = voices
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=2, max_num_batched_tokens=64))
    block = engine.kv.block_size
    ph_start = 2  # <|tts|> <|ref_audio|> P...
    ph_end = ph_start + len(codes_a) + 7
    try:
        first_a, hits = _run_one(engine, "a1", TEXT, codes_a)
        assert hits == 0
        again_a, hits_same_voice = _run_one(engine, "a2", OTHER_TEXT, codes_a)
        first_b, hits_other_voice = _run_one(engine, "b1", TEXT, codes_b)  # token-identical to a1
        again_b, hits_b_again = _run_one(engine, "b2", TEXT, codes_b)
    finally:
        engine.close()
    # everything up to <|text|> is shared by the same voice: every full block of it is reused
    assert hits_same_voice == (ph_end + 1) // block * block > 0
    assert hits_other_voice == 0  # the first block already overlaps the span: nothing shared
    assert hits_b_again >= hits_same_voice  # voice B's own blocks were cached under its own key
    assert not np.array_equal(first_a.rows, first_b.rows)  # the reference really steers the output
    np.testing.assert_array_equal(again_b.rows, first_b.rows)

    # reused KV gives the same codes as computing the prompt from scratch
    fresh = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=2, enable_prefix_caching=False))
    try:
        (uncached,) = fresh.generate([SpeechRequest("a2", OTHER_TEXT, sampling(temperature=0.0, frames=12),
                                                    stream=False, reference=reference_audio(codes_a))])
    finally:
        fresh.close()
    np.testing.assert_array_equal(again_a.rows, uncached.rows)


# ---------------------------------------------------------------------------- (c)
def test_encoder_cache_hit_on_second_encode(encoder, voices):
    codes_a, _ = voices
    calls, hits = encoder.encode_calls, encoder.cache_hits
    again = encoder.encode(_clip(0), SR)  # a new array with the same samples
    assert encoder.encode_calls == calls and encoder.cache_hits == hits + 1
    np.testing.assert_array_equal(again, codes_a)
    assert encoder.encoded_audio_seconds > 0 and encoder.encode_seconds > 0
