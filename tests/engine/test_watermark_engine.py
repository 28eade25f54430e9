"""The watermark behind the engine (engine/mark_stage.py wired by the builder): with the deploy
key on, every request's chunks, streamed or file-windowed, reach the sink marked, in the same
chunks as without it, and the detector finds the mark in what the sink got; off, nothing is
marked and nothing is built."""

from __future__ import annotations

import numpy as np
import pytest
from engine_harness import ManualEngine, engine_deploy, sampling, speech

from higgs_serve.audio.watermark import detect, load_watermarker

FRAMES = 150  # 6 s of audio


@pytest.fixture(scope="module")
def engines(tiny_loaded):
    marked = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, watermark=True))
    plain = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4))
    yield marked, plain
    marked.close()
    plain.close()


@pytest.fixture(scope="module")
def detector():
    return load_watermarker("perth", "cpu")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "file"])
def test_every_chunk_is_marked_and_the_chunks_are_unchanged(engines, detector, stream):
    marked_engine, plain_engine = engines
    requests = [speech(f"{stream}-{i}", text, sampling(0.8, i, FRAMES), stream=stream)
                for i, text in enumerate(("Hello there.", "The cat sat on the mat."))]
    marked = marked_engine.generate(requests)
    plain = plain_engine.generate(requests)
    for got, ref in zip(marked, plain):
        np.testing.assert_array_equal(got.rows, ref.rows)
        assert [(c.num_frames, c.audio.size, c.is_final, c.finish_reason) for c in got.chunks] == \
               [(c.num_frames, c.audio.size, c.is_final, c.finish_reason) for c in ref.chunks]
        change = got.audio - ref.audio
        snr_db = 10 * np.log10(np.sum(ref.audio ** 2) / np.sum(change ** 2))
        assert 10 < snr_db < 30, snr_db  # marked, and only marked
        assert detect(detector, got.audio, 24_000).detected
        assert not detect(detector, ref.audio, 24_000).detected
    stats = marked_engine.core.stats()
    assert stats["watermark_chunks"] >= sum(len(s.chunks) - 1 for s in marked)
    assert stats["watermark_audio_seconds"] >= 2 * FRAMES * 0.04
    assert "watermark_chunks" not in plain_engine.core.stats() and plain_engine.core.marks is None


def test_an_aborted_request_ends_through_the_stage(engines):
    marked_engine, _ = engines
    sink = marked_engine.submit(speech("abort-me", "Hello there.", sampling(0.8, 1, FRAMES), stream=True))
    marked_engine.steps(20)
    marked_engine.core.abort("abort-me")
    marked_engine.wait([sink])
    assert sink.chunks[-1].is_final and sink.chunks[-1].finish_reason == "abort"


def test_dummy_weights_mark_with_a_random_network_of_the_same_geometry(tiny_loaded, monkeypatch):
    """--load-format dummy builds the watermark's network with random weights (no trained file
    needed: the GPU benchmarks carry no weights), the same geometry and therefore the same work
    per chunk; the detector does not know its mark."""
    import dataclasses

    from higgs_serve.audio.perth import network as perth

    def no_checkpoint():
        raise AssertionError("a dummy-weight engine must not read the trained watermark")

    monkeypatch.setattr(perth, "find_checkpoint", no_checkpoint)
    engine = ManualEngine(dataclasses.replace(tiny_loaded, dummy_weights=True),
                          engine_deploy(max_num_seqs=2, watermark=True))
    try:
        got = engine.generate([speech("dummy", "Hello there.", sampling(0.8, 3, 50), stream=True)])[0]
        assert got.audio.size == 50 * 960 and np.isfinite(got.audio).all()
        assert engine.core.stats()["watermark_chunks"] >= len(got.chunks) - 1
        dummy = engine.core.marks.watermark.net
        assert [p.shape for p in dummy.parameters()] == [p.shape for p in perth.PerthNet().parameters()]
    finally:
        engine.close()
