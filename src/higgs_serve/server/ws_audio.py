"""How a WebSocket session's audio bytes travel (`audio_transport` in session.config).

One small class per transport, chosen once per session. The session hands each sentence's
bytes to `send_chunk` as they are ready and calls `end_sentence` once its audio is complete;
a transport that carries more per sentence (vllm-omni's JSON `audio.chunk` frames with
word timestamps) is one more class here, not a branch in the session.

    binary   one binary WebSocket message per chunk (the default)
    base64   `audio.chunk` JSON events {"utterance_index", "sentence_index", "audio"}
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Protocol

SendJson = Callable[[dict], Awaitable[None]]
SendBytes = Callable[[bytes], Awaitable[None]]


class AudioTransport(Protocol):
    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int) -> None: ...

    async def end_sentence(self, utterance_index: int, sentence_index: int) -> None: ...


class BinaryAudio:
    def __init__(self, send_json: SendJson, send_bytes: SendBytes):
        self._send_bytes = send_bytes

    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int) -> None:
        await self._send_bytes(data)

    async def end_sentence(self, utterance_index: int, sentence_index: int) -> None:
        pass


class Base64Audio:
    def __init__(self, send_json: SendJson, send_bytes: SendBytes):
        self._send_json = send_json

    async def send_chunk(self, data: bytes, utterance_index: int, sentence_index: int) -> None:
        await self._send_json({"type": "audio.chunk", "utterance_index": utterance_index,
                               "sentence_index": sentence_index,
                               "audio": base64.b64encode(data).decode("ascii")})

    async def end_sentence(self, utterance_index: int, sentence_index: int) -> None:
        pass


TRANSPORTS: dict[str, type] = {"binary": BinaryAudio, "base64": Base64Audio}
