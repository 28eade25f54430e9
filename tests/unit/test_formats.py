import io
import struct

import numpy as np
import pytest
import soundfile as sf

from higgs_serve.audio.formats import (
    MEDIA_TYPES,
    SUPPORTED_FORMATS,
    check_format,
    encode_audio,
    float_to_pcm16,
    pcm16_to_float,
    streaming_wav_header,
)
from higgs_serve.errors import InvalidRequestError

RATE = 24000


def _sine(seconds: float = 0.5, freq_hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_file_formats_decode_to_24k_mono_of_the_right_length(fmt):
    audio = _sine()
    data = encode_audio(audio, fmt, RATE)
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    assert rate == RATE and decoded.shape[1] == 1
    if fmt in ("wav", "flac"):  # lossless: exact length, 16-bit quantisation error only
        assert decoded.shape[0] == audio.shape[0]
        assert np.abs(decoded[:, 0] - audio).max() < 1e-4
    else:  # lossy codecs may pad by a frame
        assert abs(decoded.shape[0] - audio.shape[0]) <= 2048


def test_magic_bytes_and_media_types():
    audio = _sine(0.1)
    assert encode_audio(audio, "wav", RATE)[:4] == b"RIFF"
    assert encode_audio(audio, "flac", RATE)[:4] == b"fLaC"
    assert encode_audio(audio, "opus", RATE)[:4] == b"OggS"
    assert set(MEDIA_TYPES) == set(SUPPORTED_FORMATS)


def test_pcm_is_raw_little_endian_int16_and_clips():
    audio = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0], np.float32)
    data = encode_audio(audio, "pcm", RATE)
    assert data == float_to_pcm16(audio)
    values = np.frombuffer(data, "<i2")
    assert values.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767]
    assert np.allclose(pcm16_to_float(data)[:5], audio[:5], atol=1e-4)


def test_streaming_wav_header_has_unknown_sizes_and_decodes():
    header = streaming_wav_header(RATE)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", header[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF
    channels, rate = struct.unpack("<HI", header[22:28])
    assert (channels, rate) == (1, RATE)
    audio = _sine(0.2)
    decoded, rate = sf.read(io.BytesIO(header + float_to_pcm16(audio)), dtype="float32")
    assert rate == RATE and decoded.shape == audio.shape


def test_aac_and_unknown_formats_are_refused_by_name():
    with pytest.raises(InvalidRequestError, match="aac.*no packaged AAC encoder") as info:
        check_format("aac")
    assert info.value.param == "response_format"
    with pytest.raises(InvalidRequestError, match="unknown response_format 'ogg'"):
        encode_audio(_sine(0.1), "ogg", RATE)
