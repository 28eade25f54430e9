"""The batch's JSON answer sent as it is read from the items' files, so no item's audio is ever
in memory whole (docs/api.md#batch).

Each successful item's audio is an `AudioFile` (server/last_mile/audio_file.py: the whole-file path of
/speech with `stream: false`, spooled to disk past 1 MiB). The envelope is serialized once
with every `audio_data` empty; the answer is that text with each empty value filled, in order,
by the base64 of its file, read and encoded BASE64_BLOCK_BYTES at a time (a multiple of 3, so
the pieces join into one valid base64 string). Its length is known before the first byte:
sent with a Content-Length, as /speech's files are.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.background import BackgroundTask

from higgs_serve.server.last_mile.audio_file import AudioFile
from higgs_serve.server.schemas import BatchItemResult, SpeechBatchResponse
from higgs_serve.server.limits.send_timeout import ClosingStreamingResponse

BASE64_BLOCK_BYTES = 3 * (64 << 10)  # 192 KiB of audio -> 256 KiB of base64 per piece
# An item's empty audio in the envelope's JSON: a key can be written only this way (a quote in
# any string value is escaped), so splitting on it finds exactly the successful items' places.
_EMPTY_AUDIO = b'"audio_data":""'
_AUDIO_OPEN = b'"audio_data":"'


@dataclass
class BatchItem:
    result: BatchItemResult  # audio_data "" for a success: its file fills it
    file: AudioFile | None  # a success's finished file; None for an error


class BatchAnswer:
    def __init__(self, batch_id: str, items: list[BatchItem]):
        self._files = [item.file for item in items if item.file is not None]
        succeeded = len(self._files)
        envelope = SpeechBatchResponse(
            id=batch_id, results=[item.result for item in items], total=len(items),
            succeeded=succeeded, failed=len(items) - succeeded).model_dump_json().encode()
        self._texts = envelope.split(_EMPTY_AUDIO)
        if len(self._texts) != succeeded + 1:
            raise RuntimeError("an item's audio place was not found once in the envelope")
        audio_bytes = sum(len(_AUDIO_OPEN) + 4 * -(-file.size_bytes // 3) + 1
                          for file in self._files)
        self.size_bytes = sum(map(len, self._texts)) + audio_bytes

    async def body(self) -> AsyncIterator[bytes]:
        try:
            yield self._texts[0]
            for file, text in zip(self._files, self._texts[1:]):
                yield _AUDIO_OPEN
                async for block in file.blocks(BASE64_BLOCK_BYTES):
                    yield base64.b64encode(block)
                yield b'"' + text
        finally:
            self.discard()

    def discard(self) -> None:
        """Free every item's file (idempotent): after the answer, or if it is never sent."""
        for file in self._files:
            file.discard()

    @property
    def all_signed(self) -> bool:
        """Every success's file carries a C2PA manifest (vacuously true with none)."""
        return all(file.signed for file in self._files)

    def response(self, headers: dict[str, str] | None = None) -> ClosingStreamingResponse:
        return ClosingStreamingResponse(
            self.body(), media_type="application/json",
            headers={"Content-Length": str(self.size_bytes), **(headers or {})},
            background=BackgroundTask(self.discard))
