"""Detecting the mark in audio from outside: any supported file (or headerless samples) decoded
within limits, and a CPU detector loaded at its first use. Shared by
`POST /v1/audio/watermark/detect` (server/routers/watermark.py) and `higgs-serve detect`.
"""

from __future__ import annotations

import threading

import numpy as np

from higgs_serve.audio.decode import HEADERLESS, read_clip, read_headerless
from higgs_serve.audio.watermark import Detection, Watermarker, detect, load_watermarker
from higgs_serve.errors import InvalidRequestError, UnreadableAudioError

# What detection accepts (the endpoint and `higgs-serve detect`): a file of at most this many
# bytes and seconds. Decoding is bounded (audio/decode.py): its peak is about DETECT_MAX_SECONDS x
# 192 kHz x 4 bytes for a file whose header hides its length.
DETECT_MAX_BYTES = 32 * 1024 * 1024
DETECT_MAX_SECONDS = 300.0
# the rate a headerless input has unless told: what the speech endpoint sends in that encoding
HEADERLESS_DEFAULT_RATE_HZ = {"pcm": 24_000, "ulaw": 8_000, "alaw": 8_000}


def decode_for_detection(data: bytes, param: str, encoding: str | None = None,
                         rate_hz: int | None = None) -> tuple[np.ndarray, int]:
    """An audio file's bytes (any format audio/decode.py reads), or headerless samples when
    `encoding` is pcm, ulaw or alaw (at `rate_hz`, default that encoding's usual rate) ->
    ([n] float32 mono, its rate in Hz). InvalidRequestError names `param` on anything wrong."""
    if encoding is None:
        if rate_hz is not None:
            raise InvalidRequestError("sample_rate is for headerless audio: give format (pcm, ulaw or alaw) "
                                      "too, or leave it out for a file with a header", param="sample_rate")
        try:
            return read_clip(data, param, DETECT_MAX_SECONDS, what="audio to check")
        except UnreadableAudioError as error:  # headerless samples read as a file: say how to send them
            raise InvalidRequestError(f"{error}; headerless samples (16-bit pcm, µ-law, A-law) need format: "
                                      f"{', '.join(HEADERLESS)}", param=param) from error
    if encoding not in HEADERLESS:
        raise InvalidRequestError(f"format {encoding!r} is not a headerless encoding; one of "
                                  f"{', '.join(HEADERLESS)} (files with a header need no format)", param="format")
    return read_headerless(data, encoding, rate_hz or HEADERLESS_DEFAULT_RATE_HZ[encoding], param,
                           DETECT_MAX_SECONDS, what="audio to check")


class LazyDetector:
    """Detection on the CPU, its model loaded at the first use (thread-safe): the endpoint and
    the CLI need no device, and never compete with the engine's mark stage for one."""

    def __init__(self, name: str = "perth"):
        self.name = name
        self._watermark: Watermarker | None = None
        self._lock = threading.Lock()

    def detect(self, audio: np.ndarray, rate_hz: int) -> Detection:
        """[n] float32 mono at rate_hz -> Detection; WatermarkUnavailableError without the model."""
        with self._lock:
            if self._watermark is None:
                self._watermark = load_watermarker(self.name, "cpu")
        return detect(self._watermark, audio, rate_hz)
