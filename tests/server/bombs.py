"""Hostile reference clips, built in memory: small files whose headers claim huge decodes.

Each would have cost the server hundreds of MB to GBs when decoded in full before checking.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf


def silent_flac(seconds: float, channels: int, rate_hz: int = 48000) -> bytes:
    """FLAC of digital silence, written block by block (tiny on disk, big once decoded)."""
    buffer = io.BytesIO()
    block = np.zeros((rate_hz, channels), dtype=np.int16)  # one second
    with sf.SoundFile(buffer, "w", rate_hz, channels, format="FLAC", subtype="PCM_16") as handle:
        for _ in range(int(seconds)):
            handle.write(block)
    return buffer.getvalue()


def wav_with_rate(rate_hz: int, num_samples: int, channels: int = 1) -> bytes:
    """A valid PCM_16 WAV whose header claims `rate_hz` (1 Hz: 20 KB = hours of audio)."""
    data = (np.arange(num_samples * channels) % 200 - 100).astype("<i2").tobytes()
    header = (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
              + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate_hz,
                                      rate_hz * 2 * channels, 2 * channels, 16)
              + b"data" + struct.pack("<I", len(data)))
    return header + data


def wav_with_lying_length(seconds: float, rate_hz: int = 24000) -> bytes:
    """A WAV whose data size is 0xFFFFFFFF (a streaming header), holding `seconds` of audio."""
    data = np.zeros(int(seconds * rate_hz), dtype="<i2").tobytes()
    header = (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
              + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate_hz, rate_hz * 2, 2, 16)
              + b"data" + struct.pack("<I", 0xFFFFFFFF))
    return header + data


def flac_without_length(seconds: float, rate_hz: int = 24000) -> bytes:
    """Silent mono FLAC whose STREAMINFO total_samples is 0 ("unknown", as a streaming encoder
    writes it): only decoding tells its length."""
    data = bytearray(silent_flac(seconds, channels=1, rate_hz=rate_hz))
    assert data[:4] == b"fLaC"
    data[21] &= 0xF0  # STREAMINFO starts at byte 8; total_samples is its 36 bits from bit 108
    data[22:26] = bytes(4)
    return bytes(data)


def bombs() -> list[tuple[str, bytes]]:
    """(name, file bytes): each must be refused with a 400 and cost the server little memory."""
    return [
        ("8-channel silent flac", silent_flac(180, channels=8)),
        ("wav claiming 1 Hz", wav_with_rate(1, 10_000)),
        ("wav claiming 7 Hz stereo", wav_with_rate(7, 5_000, channels=2)),
        ("wav claiming 1 MHz", wav_with_rate(1_000_000, 10_000)),
        ("10-minute mono silent flac", silent_flac(600, channels=1, rate_hz=8000)),
        ("wav 40 s behind a streaming header", wav_with_lying_length(40.0)),
        ("flac of 20 minutes without a length", flac_without_length(1200)),
    ]
