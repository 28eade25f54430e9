"""Real decoders as a listener's player would run them: the ffmpeg command line and soundfile
(libsndfile). Each returns int16 samples [n] and says what it decoded."""

from __future__ import annotations

import io
import subprocess

import numpy as np
import soundfile as sf

# headerless formats: what ffmpeg must be told
_RAW = {"pcm": "s16le", "ulaw": "mulaw", "alaw": "alaw"}
# a codec frame in samples at `rate` (mp3: 576 below 32 kHz, 1152 from 32 kHz)
CODEC_FRAME = {"opus": lambda rate: rate // 50, "aac": lambda rate: 1024,
               "mp3": lambda rate: 1152 if rate >= 32000 else 576}
# what a streamed lossy file decodes to beyond its input (samples at its rate): mp3 streams
# cannot carry LAME's delay (576 encoder + 529 decoder samples), ADTS cannot carry AAC's 1024
# priming samples; both are padded to whole frames. Ogg/Opus carries pre-skip and end: exact.
STREAM_DELAY = {"mp3": 1105, "aac": 1024, "opus": 0}
# a file (stream: false): mp3's LAME/Info frame carries the delay; ADTS still cannot
FILE_DELAY = {"aac": 1024}


def ffmpeg_decode(data: bytes, response_format: str, rate_hz: int) -> np.ndarray:
    """The bytes through `ffmpeg -i -` -> int16 mono at rate_hz; raises on any decode error."""
    given = ["-f", _RAW[response_format], "-ar", str(rate_hz), "-ac", "1"] \
        if response_format in _RAW else []
    result = subprocess.run(
        ["ffmpeg", "-v", "error", *given, "-i", "-", "-f", "s16le", "-ac", "1",
         "-ar", str(rate_hz), "-"], input=data, capture_output=True, timeout=60)
    if result.returncode != 0 or result.stderr.strip():
        raise AssertionError(f"ffmpeg could not decode the {response_format}: "
                             f"{result.stderr.decode(errors='replace')[:300]}")
    return np.frombuffer(result.stdout, dtype="<i2")


def soundfile_decode(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate_hz = sf.read(io.BytesIO(data), dtype="int16")
    return samples, rate_hz
