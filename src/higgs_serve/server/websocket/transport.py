"""How a WebSocket session's audio bytes travel (`audio_transport` in session.config).

One small class per transport, chosen once per session. The session hands each sentence's
bytes to `send_chunk` as they are ready and calls `end_sentence` once its audio is complete;
a transport that carries more per sentence (vllm-omni's JSON `audio.chunk` frames with
word timestamps) is one more class here, not a branch in the session.

    binary   one binary WebSocket message per chunk (the default)
    base64   `audio.chunk` JSON events {"utterance_index", "sentence_index", "audio"}
    timestamped  with `word_timestamps` (vllm-omni's frames): `audio.chunk` JSON events
             {"utterance_index", "sentence_index", "chunk_id", "chunk_start_ms", "chunk_end_ms",
             "sample_rate", "channels", "audio_b64", "timestamps": null}, and after each sentence's
             audio one more with "audio_b64": "" and "timestamps": [{word, start_ms, end_ms}]
             (sentence-relative; [] for a sentence without words; null when alignment failed)

`covered_s` is how much of the sentence's audio (seconds from its start) the bytes sent so far
carry: exact for pcm and the G.711 formats; for a codec with lookahead (mp3, aac, opus) the
span of audio handed to the encoder, which its bytes trail by the codec's delay.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Protocol

SendJson = Callable[[dict], Awaitable[None]]
SendBytes = Callable[[bytes], Awaitable[None]]


class AudioTransport(Protocol):
    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int,
                         covered_s: float) -> None: ...

    async def end_sentence(self, utterance_index: int, sentence_index: int,
                           timestamps: list[dict] | None = None) -> None: ...


class BinaryAudio:
    def __init__(self, send_json: SendJson, send_bytes: SendBytes, sample_rate_hz: int):
        self._send_bytes = send_bytes

    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int,
                         covered_s: float) -> None:
        await self._send_bytes(data)

    async def end_sentence(self, utterance_index: int, sentence_index: int,
                           timestamps: list[dict] | None = None) -> None:
        pass


class Base64Audio:
    def __init__(self, send_json: SendJson, send_bytes: SendBytes, sample_rate_hz: int):
        self._send_json = send_json

    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int,
                         covered_s: float) -> None:
        await self._send_json({"type": "audio.chunk", "utterance_index": utterance_index,
                               "sentence_index": sentence_index,
                               "audio": base64.b64encode(data).decode("ascii")})

    async def end_sentence(self, utterance_index: int, sentence_index: int,
                           timestamps: list[dict] | None = None) -> None:
        pass


class TimestampedAudio:
    """vllm-omni's `word_timestamps` frames (module doc); any response format, base64."""

    def __init__(self, send_json: SendJson, send_bytes: SendBytes, sample_rate_hz: int):
        self._send_json = send_json
        self._rate = sample_rate_hz  # of the bytes (the session's output rate)
        self._chunk_id = 0  # within the sentence
        self._sent_ms = 0  # the sentence's audio the chunks so far carry

    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int,
                         covered_s: float) -> None:
        end_ms = round(1e3 * covered_s)
        await self._frame(data, utterance_index, sentence_index, self._sent_ms, end_ms, None)
        self._sent_ms = end_ms

    async def end_sentence(self, utterance_index: int, sentence_index: int,
                           timestamps: list[dict] | None = None) -> None:
        """The trailing frame: no audio, the sentence's span and its words."""
        await self._frame(b"", utterance_index, sentence_index, 0, self._sent_ms, timestamps)
        self._chunk_id, self._sent_ms = 0, 0

    async def _frame(self, data: bytes, utterance_index: int, sentence_index: int,
                     start_ms: int, end_ms: int, timestamps: list[dict] | None) -> None:
        await self._send_json({
            "type": "audio.chunk", "utterance_index": utterance_index,
            "sentence_index": sentence_index, "chunk_id": self._chunk_id,
            "chunk_start_ms": start_ms, "chunk_end_ms": end_ms, "sample_rate": self._rate,
            "channels": 1, "audio_b64": base64.b64encode(data).decode("ascii"),
            "timestamps": timestamps})
        self._chunk_id += 1


TRANSPORTS: dict[str, type] = {"binary": BinaryAudio, "base64": Base64Audio,
                               "timestamped": TimestampedAudio}
