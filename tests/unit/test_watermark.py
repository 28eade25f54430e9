"""The watermark itself (audio/watermark.py, audio/perth/network.py): PerTh's trained model loaded
strictly from the resemble-perth wheel, marks that its detector finds, causal chunk-wise
marking, and the refusals when the model is not there."""

from __future__ import annotations

import numpy as np
import pytest
import soxr
import torch

from higgs_serve.audio.perth import network as perth
from higgs_serve.audio.watermark import (
    THRESHOLD,
    MarkStream,
    check_available,
    detect,
    embed,
    load_watermarker,
)
from higgs_serve.errors import WatermarkUnavailableError
from support.speechlike import speechlike

RATE = 24_000


@pytest.fixture(scope="module")
def wm():
    return load_watermarker("perth", "cpu")


def _stream_marked(wm, audio: np.ndarray, chunk_frames: list[int]) -> np.ndarray:
    stream, pos, out = MarkStream(wm.context_samples), 0, []
    for frames in chunk_frames:
        chunk = audio[pos: pos + frames * 960]
        pos += chunk.size
        out.append(stream.apply(chunk, wm.residuals([stream.window(chunk)])[0]))
    return np.concatenate(out)


def test_the_trained_model_loads_every_tensor_by_name(wm):
    state = torch.load(perth.find_checkpoint(), map_location="cpu", weights_only=True)["model"]
    assert state["encoder.layers.1.conv.weight"].shape == (256, 256, 7)
    np.testing.assert_array_equal(wm.net.embedder.convs[1].weight.detach().numpy(),
                                  state["encoder.layers.1.conv.weight"].numpy())
    np.testing.assert_array_equal(wm.net.detectors[2].convs[6].bias.detach().numpy(),
                                  state["decoder.fast_layers.6.conv.bias"].numpy())


def test_a_checkpoint_that_does_not_match_is_refused():
    state = torch.load(perth.find_checkpoint(), map_location="cpu", weights_only=True)["model"]
    with pytest.raises(WatermarkUnavailableError, match="unknown \\['decoder.extra.conv.weight'\\]"):
        perth._renamed({**state, "decoder.extra.conv.weight": torch.zeros(1)}, perth.PerthNet())
    del state["encoder.layers.0.conv.bias"]
    with pytest.raises(WatermarkUnavailableError, match="missing \\['embedder.convs.0.bias'\\]"):
        perth._renamed(state, perth.PerthNet())


def test_marked_speech_is_detected_and_unmarked_is_not(wm):
    for seed in range(3):
        audio = speechlike(6.0, seed)
        marked = embed(wm, audio)
        assert marked.shape == audio.shape and marked.dtype == np.float32
        assert detect(wm, marked, RATE).detected and detect(wm, marked, RATE).score > 0.9
        assert not detect(wm, audio, RATE).detected and detect(wm, audio, RATE).score < 0.1


def test_the_mark_changes_only_the_band_below_2_khz(wm):
    audio = speechlike(4.0, 1)
    change = embed(wm, audio) - audio
    spectrum = np.abs(np.fft.rfft(change))
    freqs = np.fft.rfftfreq(change.size, 1 / RATE)
    assert spectrum[freqs > 2200].max() < 1e-3 * spectrum[freqs < 2000].max()
    snr_db = 10 * np.log10(np.sum(audio ** 2) / np.sum(change ** 2))
    assert 12 < snr_db < 25  # PerTh's strength (benchmarks/results/README.md: ~16 dB on speech)


def test_detection_resamples_other_rates(wm):
    marked = embed(wm, speechlike(6.0, 2))
    for rate in (8000, 16000, 44100, 48000):
        assert detect(wm, soxr.resample(marked, RATE, rate), rate).detected, rate


def test_chunkwise_marking_is_causal_and_detected(wm):
    audio = speechlike(5.0, 3)  # 125 frames
    schedule = [1, 1, 2, 4, 8, 16, 25, 25, 25, 18]
    streamed = _stream_marked(wm, audio, schedule)
    assert streamed.shape == audio.shape
    assert detect(wm, streamed, RATE).detected
    # a chunk's marked samples depend only on what came before it: change the future and the
    # first seven chunks (57 frames) come out the same
    other = audio.copy()
    other[57 * 960:] = speechlike(5.0, 4)[57 * 960:]
    np.testing.assert_array_equal(_stream_marked(wm, other, schedule)[: 57 * 960], streamed[: 57 * 960])


def test_a_batch_of_windows_marks_each_as_alone(wm):
    rng = np.random.default_rng(0)
    windows = [speechlike(1.2, 5), speechlike(0.5, 6), rng.standard_normal(12000).astype(np.float32) * 0.1,
               speechlike(0.5, 7)]
    together = wm.residuals(windows)
    for window, residual in zip(windows, together):  # bit for bit: each window alone on the CPU (perth/runner.py)
        np.testing.assert_array_equal(residual, wm.residuals([window])[0])


def test_an_empty_chunk_stays_empty_and_silence_stays_silent(wm):
    stream = MarkStream(wm.context_samples)
    assert stream.apply(np.zeros(0, np.float32), np.zeros(0, np.float32)).size == 0
    silence = np.zeros(4800, np.float32)
    np.testing.assert_array_equal(stream.apply(silence, wm.residuals([stream.window(silence)])[0]), silence)
    assert detect(wm, silence, RATE).score == 0.0 and not detect(wm, silence[:100], RATE).detected


def test_missing_package_or_model_file_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(perth, "CHECKPOINT_RELPATH", ("no_such_model.pth.tar",))
    with pytest.raises(WatermarkUnavailableError, match="resemble-perth is installed but its trained model is missing"):
        check_available()
    monkeypatch.setattr(perth.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(WatermarkUnavailableError, match="needs the resemble-perth package"):
        load_watermarker()
    with pytest.raises(WatermarkUnavailableError, match="unknown watermark 'audioseal'"):
        load_watermarker("audioseal")
    assert THRESHOLD == 0.4


def test_short_windows_take_the_gemm_form_with_the_same_result(wm, monkeypatch):
    audio = speechlike(3.0, 9)
    start = max(int(np.argmax(np.abs(audio))) - 1440, 0)
    chunk = audio[start: start + 3 * 960]  # 3 voiced frames: an early chunk (GEMM form on the CPU)
    gemm = wm.residuals([chunk])[0]
    monkeypatch.setattr(perth, "GEMM_MAX_FRAMES", 0)  # the convolutions as torch runs them
    conv = wm.residuals([chunk])[0]
    assert np.abs(gemm - conv).max() <= 1e-5 * np.abs(conv).max()
