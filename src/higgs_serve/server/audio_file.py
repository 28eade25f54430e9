"""The whole-file path: a response (or a batch item) answered as one file, built while the audio
arrives, in bounded memory.

`AudioFile` feeds each chunk through the response's `AudioOut` (seekable: the encoder's header
patches apply) and writes the bytes to a spooled temporary file that stays in memory up to
SPOOL_MEMORY_BYTES and moves to disk (the system temp directory) past it. Nothing holds the
float audio: a 7,200 s long-form WAV is 345 MB on disk and about SPOOL_MEMORY_BYTES of RSS
(docs/api.md#limits). `file_response` sends it with its Content-Length and closes it after.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Mapping

import numpy as np
from starlette.background import BackgroundTask

from higgs_serve.audio.encoders import apply_patches
from higgs_serve.server.audio_out import AudioOut
from higgs_serve.server.send_timeout import ClosingStreamingResponse

SPOOL_MEMORY_BYTES = 1 << 20  # 1 MiB: about 20 s of 24 kHz WAV; longer files go to disk
_READ_BLOCK_BYTES = 256 << 10


class AudioFile:
    def __init__(self, out: AudioOut):
        self._out = out
        self._file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES,
                                                    prefix="higgs-serve-")
        self.size_bytes = 0
        self.finished = False

    async def add(self, audio: np.ndarray) -> None:
        """audio: [n] float32 at the model's rate."""
        self._write(await self._out.push(audio))

    async def finish(self) -> None:
        """Flush the pipeline and apply the header patches: the file is complete."""
        self._write(await self._out.close())
        for offset, value in self._out.patches():
            self._file.seek(offset)
            self._file.write(value)
        self._file.seek(0)
        self.finished = True

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self.size_bytes += len(data)

    @property
    def on_disk(self) -> bool:
        return bool(getattr(self._file, "_rolled", False))

    def read_all(self) -> bytes:
        """The whole file in memory (batch items, which answer in JSON)."""
        data = bytearray(self._file.read())
        self._file.seek(0)
        return bytes(data)

    async def blocks(self, block_bytes: int = _READ_BLOCK_BYTES) -> AsyncIterator[bytes]:
        """The finished file, block_bytes at a time (the last block shorter); discarded after."""
        try:
            while block := self._file.read(block_bytes):
                yield block
        finally:
            self.discard()

    def discard(self) -> None:
        """Free the memory or the temporary file (idempotent)."""
        self._file.close()


async def collect_file(audio: AsyncIterator[np.ndarray], out: AudioOut) -> AudioFile:
    """Every chunk of `audio` into one finished AudioFile; on any failure (or cancellation) the
    partial file is discarded."""
    file = AudioFile(out)
    try:
        async for chunk in audio:
            await file.add(chunk)
        await file.finish()
    except BaseException:
        file.discard()
        raise
    return file


def file_response(file: AudioFile, media_type: str,
                  headers: Mapping[str, str]) -> ClosingStreamingResponse:
    """A finished AudioFile as the response body, with its Content-Length; closed after."""
    return ClosingStreamingResponse(file.blocks(), media_type=media_type,
                                    headers={**headers, "Content-Length": str(file.size_bytes)},
                                    background=BackgroundTask(file.discard))
