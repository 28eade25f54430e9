"""The response formats and the one float -> int16 conversion every one of them starts from.

All audio inside higgs-serve is float32 mono at 24 kHz; `float_to_int16` is the only place it
becomes integer samples, and every format (pcm, wav, flac, G.711, and the samples handed to the
mp3/opus/aac encoders) is encoded from those same int16 samples by an incremental encoder
(audio/encoders/), so one request and seed gives the same samples in wav, flac and pcm whether
the response is streamed or answered as one file (docs/api.md#formats).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from higgs_serve.errors import InvalidRequestError

# The rates a response may ask for (`sample_rate`); the model always generates 24 kHz and the
# audio is resampled (audio/output_rate.py). At each, a 40 ms frame is a whole number of samples.
OUTPUT_SAMPLE_RATES: tuple[int, ...] = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)
PCM_BITS_PER_SAMPLE = 16


@dataclass(frozen=True)
class AudioFormat:
    name: str
    media_type: str
    rates_hz: tuple[int, ...]  # of OUTPUT_SAMPLE_RATES, those the format can carry
    default_rate_hz: int | None  # None: the model's own rate (24 kHz)
    bits_per_sample: int | None  # of the samples on the wire; None for a compressed codec
    lossless: bool  # decodes to exactly the int16 samples it was given
    # the file's header states its length (WAV sizes, FLAC total samples), which a stream's header
    # cannot know: a request that does not ask to stream gets these as a file (docs/api.md#streaming)
    header_states_length: bool = False


_ALL = OUTPUT_SAMPLE_RATES
FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("wav", "audio/wav", _ALL, None, 16, True, header_states_length=True),
    AudioFormat("pcm", "audio/pcm", _ALL, None, 16, True),
    AudioFormat("flac", "audio/flac", _ALL, None, 16, True, header_states_length=True),
    AudioFormat("mp3", "audio/mpeg", _ALL, None, None, False),
    # libopus encodes 8, 12, 16, 24 and 48 kHz only
    AudioFormat("opus", "audio/ogg", (8000, 16000, 24000, 48000), None, None, False),
    AudioFormat("aac", "audio/aac", _ALL, None, None, False),
    # G.711 (telephony): headerless 8-bit samples, 8 kHz unless `sample_rate` says otherwise
    AudioFormat("ulaw", "audio/PCMU", _ALL, 8000, 8, False),
    AudioFormat("alaw", "audio/PCMA", _ALL, 8000, 8, False),
)}
SUPPORTED_FORMATS: tuple[str, ...] = tuple(FORMATS)
MEDIA_TYPES: dict[str, str] = {name: f.media_type for name, f in FORMATS.items()}


def check_format(response_format: str) -> AudioFormat:
    """The format's description; InvalidRequestError (param response_format) if there is none."""
    found = FORMATS.get(response_format)
    if found is None:
        raise InvalidRequestError(
            f"unknown response_format {response_format!r}; supported: {', '.join(FORMATS)}",
            param="response_format")
    return found


def output_rate_hz(response_format: str, requested_hz: int | None, model_rate_hz: int) -> int:
    """The response's sample rate: the one asked for, else the format's default (G.711: 8 kHz),
    else the model's. Checked: InvalidRequestError (param sample_rate) for a rate that is not
    offered or that the format cannot carry."""
    fmt = check_format(response_format)
    rate_hz = requested_hz if requested_hz is not None else (fmt.default_rate_hz or model_rate_hz)
    if rate_hz not in OUTPUT_SAMPLE_RATES:
        raise InvalidRequestError(
            f"sample_rate {rate_hz} is not offered; choose one of "
            f"{', '.join(map(str, OUTPUT_SAMPLE_RATES))} (the model generates {model_rate_hz})",
            param="sample_rate")
    if rate_hz not in fmt.rates_hz:
        raise InvalidRequestError(
            f"{fmt.name} cannot be encoded at {rate_hz} Hz; use one of "
            f"{', '.join(map(str, fmt.rates_hz))} or another response_format",
            param="sample_rate")
    return rate_hz


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

