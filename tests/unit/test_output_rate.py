"""audio/output_rate.py: sample_rate resampling, whole and streamed, and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from higgs_serve.audio.formats import OUTPUT_SAMPLE_RATES, output_rate_hz
from higgs_serve.audio.output_rate import StreamResampler, resample
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


def test_checks_name_sample_rate_and_the_format_defaults():
    assert output_rate_hz("mp3", 44100, 24000) == 44100
    assert output_rate_hz("wav", None, 24000) == 24000
    assert output_rate_hz("ulaw", None, 24000) == output_rate_hz("alaw", None, 24000) == 8000
    assert output_rate_hz("ulaw", 16000, 24000) == 16000  # headerless: any offered rate
    for rate, fmt, match in [(12345, "wav", "not offered"), (0, "pcm", "not offered"),
                             (22050, "opus", "opus cannot be encoded at 22050")]:
        with pytest.raises(InvalidRequestError, match=match) as info:
            output_rate_hz(fmt, rate, 24000)
        assert info.value.param == "sample_rate"
    with pytest.raises(InvalidRequestError, match="unknown response_format") as info:
        output_rate_hz("ogg", None, 24000)
    assert info.value.param == "response_format"
