"""Audio encoders for the speech API: wav, pcm, flac, mp3, opus, and the streaming WAV header.

All audio inside higgs-serve is float32 mono at 24 kHz; this module is the only place that turns
it into bytes, and `float_to_int16` the only float -> int16 conversion: every format (pcm, wav,
flac, and the samples handed to the mp3/opus encoders) is written from the same int16 samples, so
one request and seed gives the same samples in wav as in pcm. Encoding goes through soundfile (libsndfile 1.2.2 from its wheel), which writes
every format below to memory. AAC has no packaged encoder (soundfile cannot write it and PyAV is
not a dependency), so asking for it is an error that says so, never a silent substitute.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf

from higgs_serve.errors import InvalidRequestError

# format name -> (libsndfile container, subtype); pcm is handled without libsndfile.
_SOUNDFILE_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}

SUPPORTED_FORMATS: tuple[str, ...] = ("wav", "pcm", "flac", "mp3", "opus")
# Formats that can be produced chunk by chunk (the others need the whole signal).
STREAMABLE_FORMATS: tuple[str, ...] = ("wav", "pcm")
# Known to clients (OpenAI's list) but without an encoder in this build.
UNAVAILABLE_FORMATS: dict[str, str] = {
    "aac": "response_format 'aac' is not supported: this build has no packaged AAC encoder; "
    "use one of wav, pcm, flac, mp3, opus",
}

MEDIA_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}

PCM_BITS_PER_SAMPLE = 16


def check_format(response_format: str) -> None:
    """Raise InvalidRequestError (param response_format) unless the format can be encoded."""
    if response_format in SUPPORTED_FORMATS:
        return
    message = UNAVAILABLE_FORMATS.get(
        response_format,
        f"unknown response_format {response_format!r}; supported: {', '.join(SUPPORTED_FORMATS)}",
    )
    raise InvalidRequestError(message, param="response_format")


def float_to_int16(audio: np.ndarray) -> np.ndarray:
    """audio: [n] float32 in [-1, 1] -> [n] little-endian int16 (clipped; scaled by 32767)."""
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2")


def float_to_pcm16(audio: np.ndarray) -> bytes:
    """audio: [n] float32 in [-1, 1] -> little-endian int16 bytes (`float_to_int16`)."""
    return float_to_int16(audio).tobytes()


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Inverse of float_to_pcm16: little-endian int16 bytes -> [n] float32."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0


def streaming_wav_header(sample_rate_hz: int, channels: int = 1) -> bytes:
    """A 44-byte PCM_16 WAV header whose RIFF and data sizes are 0xFFFFFFFF (length unknown).

    Players and decoders (soundfile, ffmpeg) read such a stream up to its end.
    """
    byte_rate = sample_rate_hz * channels * PCM_BITS_PER_SAMPLE // 8
    block_align = channels * PCM_BITS_PER_SAMPLE // 8
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate_hz, byte_rate,
                                block_align, PCM_BITS_PER_SAMPLE)
        + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )


def encode_audio(audio: np.ndarray, response_format: str, sample_rate_hz: int) -> bytes:
    """Encode a whole signal. audio: [n] float32 mono -> file bytes in `response_format`."""
    check_format(response_format)
    if response_format == "pcm":
        return float_to_pcm16(audio)
    container, subtype = _SOUNDFILE_FORMATS[response_format]
    # int16 in: libsndfile writes PCM_16 samples as given (no second rounding of its own)
    samples = float_to_int16(audio)
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate_hz, format=container, subtype=subtype)
    return buffer.getvalue()
