"""audio/formats.py: the format table, the rate rules and the one float -> int16 conversion."""

import numpy as np
import pytest

from higgs_serve.audio.formats import (
    FORMATS,
    MEDIA_TYPES,
    OUTPUT_SAMPLE_RATES,
    SUPPORTED_FORMATS,
    check_format,
    float_to_int16,
    float_to_pcm16,
    pcm16_to_float,
)
from higgs_serve.errors import InvalidRequestError
from higgs_serve.server.schemas import ResponseFormat


def test_every_format_of_the_schema_has_an_entry_and_the_table_is_consistent():
    assert set(ResponseFormat.__args__) == set(SUPPORTED_FORMATS) == set(MEDIA_TYPES)
    assert set(SUPPORTED_FORMATS) == {"wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw"}
    for fmt in FORMATS.values():
        assert set(fmt.rates_hz) <= set(OUTPUT_SAMPLE_RATES)
        assert fmt.default_rate_hz is None or fmt.default_rate_hz in fmt.rates_hz
    assert FORMATS["ulaw"].default_rate_hz == FORMATS["alaw"].default_rate_hz == 8000


def test_unknown_formats_are_refused_by_name():
    with pytest.raises(InvalidRequestError, match="unknown response_format 'ogg'") as info:
        check_format("ogg")
    assert info.value.param == "response_format"
    assert check_format("aac").media_type == "audio/aac"  # PyAV's FFmpeg encodes it


def test_pcm_conversion_is_little_endian_int16_and_clips():
    audio = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0], np.float32)
    data = float_to_pcm16(audio)
    assert data == float_to_int16(audio).tobytes()
    values = np.frombuffer(data, "<i2")
    assert values.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767]
    assert np.allclose(pcm16_to_float(data)[:5], audio[:5], atol=1e-4)
