"""CodecEncoder vs transformers' HiggsAudioV2TokenizerModel.encode (tiny geometry, random weights),
our resampler vs the torchaudio stand-in the reference uses, and prepare_reference_audio."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.codec_fixtures import tiny_codec_module

from higgs_serve.codec.encoder import CodecEncoder, acoustic_output_length, prepare_reference_audio
from higgs_serve.codec.resample import resample
from higgs_serve.errors import InvalidRequestError


@pytest.fixture(scope="module")
def setup():
    return tiny_codec_module(CodecEncoder)


def _clip(seconds: float, seed: int) -> torch.Tensor:
    n = round(seconds * 24000)
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 24000
    return 0.2 * torch.randn(n, generator=g) + 0.5 * torch.sin(2 * math.pi * 220 * t)  # noise + a sine


def _reference_codes(codec, audio: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return codec.reference.encode(audio[None, None], return_dict=False)[0].T  # [T, 8]


@pytest.mark.parametrize("seconds", [1.0, 1.3, 2.0])
def test_encode_matches_transformers(setup, seconds):
    codec, ours = setup
    audio = _clip(seconds, seed=int(seconds * 10))
    got = ours.encode(audio)
    want = _reference_codes(codec, audio)
    assert got.dtype == torch.int64 and got.shape == (math.ceil(seconds * 25), 8)
    assert torch.equal(got, want)
    assert len(torch.unique(got[:, 0])) > 1  # random weights give varied codes, not a constant


def test_length_needing_the_acoustic_pad_quirk(setup):
    """1.3 s makes the unpadded DAC encoder one frame short, so the reference pads by hop/2."""
    codec, ours = setup
    n = round(1.3 * 24000)
    assert acoustic_output_length(n, codec.cfg) != math.ceil(n / 960)
    assert acoustic_output_length(n + 960, codec.cfg) == math.ceil(n / 960)


def test_short_clip_is_padded_to_one_second(setup):
    codec, ours = setup
    audio = _clip(0.4, seed=4)
    got = ours.encode(audio)
    assert got.shape == (25, 8)
    assert torch.equal(got, _reference_codes(codec, F.pad(audio, (0, 24000 - audio.numel()))))


def test_resample_matches_reference_stand_in():
    import torchaudio.functional as TAF  # the stand-in (or real torchaudio where it loads)

    x = _clip(1.3, seed=7)[None]
    ours = resample(x, 24000, 16000)
    theirs = TAF.resample(x, 24000, 16000)
    assert ours.shape == theirs.shape == (1, math.ceil(len(x[0]) * 2 / 3))
    assert (ours - theirs).abs().max().item() <= 2e-6


def test_resample_keeps_a_passband_sine():
    t = torch.arange(24000, dtype=torch.float64) / 24000
    y = resample(torch.sin(2 * math.pi * 440 * t), 24000, 16000)
    t16 = torch.arange(16000, dtype=torch.float64) / 16000
    assert (y - torch.sin(2 * math.pi * 440 * t16))[300:-300].abs().max().item() < 1e-3
    assert resample(torch.ones(3, 4800), 24000, 16000)[:, 100:-100].sub(1).abs().max().item() < 1e-3


def test_prepare_reference_audio_mono_resample_and_types():
    pytest.importorskip("soxr")  # a product dependency; absent only on the bare GPU image
    sr = 44100
    t = np.arange(sr) / sr
    stereo = np.stack([np.sin(2 * np.pi * 300 * t), np.zeros(sr)], axis=1)  # [n, 2] float64
    out = prepare_reference_audio(stereo, sr)
    assert out.dtype == np.float32 and out.ndim == 1 and out.shape[0] == 24000
    want = 0.5 * np.sin(2 * np.pi * 300 * np.arange(24000) / 24000)
    assert np.abs(out - want)[500:-500].max() < 1e-3
    pcm = (np.sin(2 * np.pi * 300 * np.arange(2400) / 24000) * 16384).astype(np.int16)
    np.testing.assert_allclose(prepare_reference_audio(pcm, 24000), pcm / 32768.0, atol=1e-7)
    with pytest.raises(InvalidRequestError, match="empty"):
        prepare_reference_audio(np.zeros(0, np.float32), 24000)
    with pytest.raises(InvalidRequestError, match="NaN"):
        prepare_reference_audio(np.array([0.0, np.nan], np.float32), 24000)
    with pytest.raises(InvalidRequestError, match="shape"):
        prepare_reference_audio(np.zeros((2, 2, 2), np.float32), 24000)
