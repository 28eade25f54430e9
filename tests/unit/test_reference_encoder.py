"""ReferenceEncoder service (issue 5): input decoding, limits, the code cache and thread safety.

The codec math itself is checked by tests/parity/test_codec_encoder_parity.py; here a small
deterministic stand-in encoder keeps every test in milliseconds.
"""

from __future__ import annotations

import hashlib
import io
import threading

import numpy as np
import pytest
import soundfile as sf
import torch
from torch import nn

from higgs_serve.errors import InvalidRequestError
from higgs_serve.voices.reference_encoder import CodesCache, ReferenceEncoder, ReferenceLimits, reference_audio

SR = 24000


class FakeCodecEncoder(nn.Module):
    """audio [n] -> codes [ceil(n / 960), 8]: a deterministic function of the samples."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()), requires_grad=False)
        self.calls = 0

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        frames = -(-audio.numel() // 960)
        padded = torch.nn.functional.pad(audio, (0, frames * 960 - audio.numel())).view(frames, 960)
        energy = (padded.abs().sum(dim=1) * 1000).to(torch.int64)  # [T]
        return (energy[:, None] + torch.arange(8)) % 1024  # [T, 8] int64


def _service(**limits) -> tuple[ReferenceEncoder, FakeCodecEncoder]:
    fake = FakeCodecEncoder()
    return ReferenceEncoder(lambda: fake, SR, ReferenceLimits(**limits)), fake


def _tone(seconds: float, freq: float = 220.0, rate: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _file_bytes(audio: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


# ---------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("fmt,subtype,lossless", [
    ("WAV", "PCM_16", True), ("FLAC", "PCM_16", True), ("OGG", "VORBIS", False), ("MP3", "MPEG_LAYER_III", False),
])
def test_formats_decode_to_mono_float(fmt, subtype, lossless):
    audio = _tone(1.0)
    samples, rate = ReferenceEncoder.decode_audio_bytes(_file_bytes(audio, SR, fmt, subtype))
    assert rate == SR and samples.dtype == np.float32 and samples.ndim == 1
    if lossless:
        np.testing.assert_allclose(samples, audio, atol=1e-4)
    else:  # lossy codecs add encoder delay/padding: compare length and level only
        assert abs(len(samples) - len(audio)) < 0.1 * SR
        assert abs(np.sqrt(np.mean(samples**2)) - np.sqrt(np.mean(audio**2))) < 0.05


def test_stereo_and_other_rates_are_mixed_and_resampled():
    service, fake = _service()
    left, right = _tone(1.0, rate=16000), np.zeros(16000, np.float32)
    data = _file_bytes(np.stack([left, right], axis=1), 16000, "WAV", "FLOAT")
    samples, rate = service.decode_audio_bytes(data)
    assert rate == 16000
    np.testing.assert_allclose(samples, left / 2, atol=1e-6)
    codes = service.encode_bytes(data)
    assert codes.shape == (25, 8) and codes.dtype == np.int64  # 1 s at 24 kHz = 25 frames
    assert fake.calls == 1


@pytest.mark.parametrize("data", [b"", b"not audio at all", b"RIFF\x00\x00\x00\x00WAVEjunk", bytes(range(256)) * 8])
def test_unreadable_audio_is_a_clear_error(data):
    service, fake = _service()
    with pytest.raises(InvalidRequestError) as err:
        service.encode_bytes(data)
    assert err.value.param == "ref_audio" and "ref_audio" in str(err.value)
    assert fake.calls == 0


def test_duration_limits_name_the_limit():
    service, fake = _service()
    with pytest.raises(InvalidRequestError, match=r"0\.30 s long; reference audio must be at least 0\.5 s") as err:
        service.encode_bytes(_file_bytes(_tone(0.3), SR, "WAV"))
    assert err.value.param == "ref_audio"
    silence = np.zeros(int(30.5 * 8000), np.float32)  # 8 kHz keeps the file small
    with pytest.raises(InvalidRequestError, match=r"30\.50 s long; reference audio may be at most 30 s"):
        service.encode_bytes(_file_bytes(silence, 8000, "WAV"))
    assert fake.calls == 0
    # configurable, and the param name follows the caller (a registered voice, a CLI file)
    strict, _ = _service(min_seconds=1.0, max_seconds=2.0)
    with pytest.raises(InvalidRequestError, match="at most 2 s") as err:
        strict.encode(_tone(2.5), SR, param="voice")
    assert err.value.param == "voice"
    assert strict.encode(_tone(1.5), SR).shape == (38, 8)


def test_bad_samples_are_rejected():
    service, _ = _service()
    bad = _tone(1.0)
    bad[10] = np.nan
    with pytest.raises(InvalidRequestError, match="NaN") as err:
        service.encode(bad, SR)
    assert err.value.param == "ref_audio"


# ---------------------------------------------------------------------------- cache
def test_cache_hit_by_content_not_identity():
    service, fake = _service()
    audio = _tone(1.0)
    first = service.encode(audio, SR)
    again = service.encode(audio.copy(), SR)  # another array, same samples
    from_file = service.encode_bytes(_file_bytes(audio, SR, "WAV", "FLOAT"))  # same decoded samples
    assert (service.encode_calls, service.cache_hits, fake.calls) == (1, 2, 1)
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(from_file, first)
    first[:] = 0  # each caller owns its copy: the cached codes stay intact
    np.testing.assert_array_equal(service.encode(audio, SR), again)
    assert service.cache_hits == 3
    other = service.encode(_tone(1.0, freq=330.0), SR)
    assert service.encode_calls == 2 and not np.array_equal(other, first)
    np.testing.assert_array_equal(service(audio), again)  # the server hook (24 kHz) shares the cache
    assert service.cache_hits == 4


def test_lru_bounded_by_entries():
    service, fake = _service(cache_entries=2)
    clips = [_tone(1.0, freq=f) for f in (200.0, 300.0, 400.0)]
    service.encode(clips[0], SR)
    service.encode(clips[1], SR)
    service.encode(clips[0], SR)  # refresh clip 0: clip 1 is now the oldest
    service.encode(clips[2], SR)  # evicts clip 1
    assert service.cache_size == 2 and fake.calls == 3
    service.encode(clips[0], SR)
    assert fake.calls == 3  # still cached
    service.encode(clips[1], SR)
    assert fake.calls == 4  # was evicted


def test_codes_cache_bounded_by_bytes():
    row_bytes = 8 * 8
    cache = CodesCache(max_entries=100, max_bytes=50 * row_bytes)
    for i in range(4):
        cache.put(f"k{i}", np.zeros((20, 8), np.int64))  # 20 rows each: at most 2 fit
        assert cache.num_bytes <= 50 * row_bytes
    assert len(cache) == 2 and cache.get("k0") is None and cache.get("k3") is not None
    cache.put("huge", np.zeros((60, 8), np.int64))  # larger than the whole budget: not cached
    assert cache.get("huge") is None and len(cache) == 2
    disabled = CodesCache(max_entries=0, max_bytes=1 << 20)
    disabled.put("k", np.zeros((1, 8), np.int64))
    assert len(disabled) == 0


def test_concurrent_encodes_of_one_clip_run_the_encoder_once():
    service, fake = _service()
    audio = _tone(1.0)
    results, barrier = [], threading.Barrier(6)

    def work():
        barrier.wait()
        results.append(service.encode(audio, SR))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 1 and service.encode_calls == 1 and service.cache_hits == 5
    assert all(np.array_equal(r, results[0]) for r in results)


def test_lazy_build_happens_once():
    builds = []

    def build():
        builds.append(1)
        return FakeCodecEncoder()

    service = ReferenceEncoder(build, SR)
    assert builds == []
    service.encode(_tone(1.0), SR)
    service.encode(_tone(1.0, freq=500.0), SR)
    service.warm()
    assert builds == [1]


# ---------------------------------------------------------------------------- ReferenceAudio
def test_reference_audio_content_key():
    codes = np.arange(80, dtype=np.int32).reshape(10, 8) % 1024
    ref = reference_audio(codes, "Hello there.")
    assert ref.codes.dtype == np.int64 and ref.ref_text == "Hello there."
    assert ref.content_key == hashlib.sha256(codes.astype(np.int64).tobytes()).hexdigest()
    assert reference_audio(codes, "other text").content_key == ref.content_key  # keyed by the audio
    changed = codes.copy()
    changed[3, 5] += 1
    assert reference_audio(changed).content_key != ref.content_key
    assert reference_audio(codes, "   ").ref_text is None
    assert ReferenceEncoder.reference_audio(codes).content_key == ref.content_key
    with pytest.raises(InvalidRequestError, match=r"\[T>0, 8\]"):
        reference_audio(np.zeros((4, 7), np.int64))
    with pytest.raises(InvalidRequestError):
        reference_audio(np.zeros((0, 8), np.int64))


def test_limits_validation():
    with pytest.raises(ValueError, match="min_seconds"):
        ReferenceLimits(min_seconds=5.0, max_seconds=1.0)
    with pytest.raises(ValueError, match="cache"):
        ReferenceLimits(cache_bytes=-1)
