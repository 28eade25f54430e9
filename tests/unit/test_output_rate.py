"""audio/output_rate.py: sample_rate resampling, whole and streamed, and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from higgs_serve.audio.output_rate import OUTPUT_SAMPLE_RATES, StreamResampler, check_output_rate, resample
from higgs_serve.errors import InvalidRequestError


@pytest.mark.parametrize("rate", OUTPUT_SAMPLE_RATES)
def test_stream_matches_one_shot_and_frames_map_to_whole_samples(rate):
    audio = np.random.default_rng(0).standard_normal(20 * 960).astype(np.float32) * 0.1
    whole = resample(audio, 24000, rate)
    stream = StreamResampler(24000, rate)
    pieces = [stream.push(audio[i:i + 1920], last=False) for i in range(0, len(audio), 1920)]
    pieces.append(stream.push(np.zeros(0, np.float32), last=True))
    streamed = np.concatenate(pieces)
    assert len(whole) == len(streamed) == 20 * rate // 25
    np.testing.assert_allclose(streamed, whole, atol=1e-6)


def test_checks():
    check_output_rate(44100, "mp3")
    with pytest.raises(InvalidRequestError, match="not offered"):
        check_output_rate(12345, "wav")
    with pytest.raises(InvalidRequestError, match="opus"):
        check_output_rate(22050, "opus")
