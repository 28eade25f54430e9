"""The uncompressed formats: pcm (s16le), wav (a PCM_16 header, then s16le) and G.711 (µ-law,
A-law: one byte a sample, headerless). Nothing is held back: every push returns its samples."""

from __future__ import annotations

import struct
from functools import cache

import numpy as np

from higgs_serve.audio.encoders.base import Patch, StreamEncoder

PCM_BITS_PER_SAMPLE = 16
UNKNOWN_SIZE = 0xFFFFFFFF  # a RIFF/data size a streaming WAV header cannot know yet
WAV_HEADER_BYTES = 44


class PcmEncoder(StreamEncoder):
    def push(self, samples: np.ndarray) -> bytes:
        return np.asarray(samples, dtype="<i2").tobytes()

    def close(self) -> bytes:
        return b""


def wav_header(sample_rate_hz: int, data_bytes: int = UNKNOWN_SIZE, channels: int = 1) -> bytes:
    """A 44-byte PCM_16 WAV header; `data_bytes` UNKNOWN_SIZE (the default) gives a streaming
    header whose RIFF and data sizes are 0xFFFFFFFF, which soundfile and ffmpeg read to the end."""
    byte_rate = sample_rate_hz * channels * PCM_BITS_PER_SAMPLE // 8
    block_align = channels * PCM_BITS_PER_SAMPLE // 8
    riff_bytes = UNKNOWN_SIZE if data_bytes == UNKNOWN_SIZE else data_bytes + WAV_HEADER_BYTES - 8
    return (
        b"RIFF" + struct.pack("<I", riff_bytes) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate_hz, byte_rate,
                                block_align, PCM_BITS_PER_SAMPLE)
        + b"data" + struct.pack("<I", data_bytes)
    )


class WavEncoder(StreamEncoder):
    """The streaming header first; a file gets the real sizes patched in at close."""

    def __init__(self, sample_rate_hz: int):
        self.sample_rate_hz = sample_rate_hz
        self._header_sent = False
        self._data_bytes = 0

    def _header(self) -> bytes:
        if self._header_sent:
            return b""
        self._header_sent = True
        return wav_header(self.sample_rate_hz)

    def push(self, samples: np.ndarray) -> bytes:
        data = np.asarray(samples, dtype="<i2").tobytes()
        self._data_bytes += len(data)
        return self._header() + data

    def close(self) -> bytes:
        return self._header()

    def patches(self) -> list[Patch]:
        return [(0, wav_header(self.sample_rate_hz, self._data_bytes))]


@cache
def g711_table(law: str) -> np.ndarray:
    """[65536] uint8: the G.711 byte of every int16 value (index = value + 32768), made once by
    FFmpeg's own pcm_mulaw / pcm_alaw encoder, so a push is one table lookup."""
    import av  # PyAV: only when a G.711 response is first asked for

    codec = av.CodecContext.create({"ulaw": "pcm_mulaw", "alaw": "pcm_alaw"}[law], "w")
    codec.sample_rate, codec.layout, codec.format = 8000, "mono", "s16"
    codec.open()
    every_value = np.arange(-32768, 32768, dtype=np.int16)[None, :]
    frame = av.AudioFrame.from_ndarray(every_value, format="s16", layout="mono")
    frame.sample_rate = 8000
    table = b"".join(bytes(packet) for packet in [*codec.encode(frame), *codec.encode(None)])
    return np.frombuffer(table, dtype=np.uint8).copy()


class G711Encoder(StreamEncoder):
    def __init__(self, law: str):
        self._table = g711_table(law)

    def push(self, samples: np.ndarray) -> bytes:
        index = np.asarray(samples, dtype=np.int16).astype(np.int32) + 32768
        return self._table[index].tobytes()

    def close(self) -> bytes:
        return b""
