"""The whole-file path: a response (or a batch item) answered as one file, built while the audio
arrives, in bounded memory.

`AudioFile` feeds each chunk through the response's `AudioOut` (seekable: the encoder's header
patches apply) and writes the bytes to a spooled temporary file that stays in memory up to
SPOOL_MEMORY_BYTES and moves to disk (the system temp directory) past it. Nothing holds the
float audio: a 7,200 s long-form WAV is 345 MB on disk and about SPOOL_MEMORY_BYTES of RSS
(docs/api.md#limits). An encoding that restarted on another encoder process (its own lost:
server/last_mile/encode_pool.py) hands back every byte from the start: the file starts over with
them. `file_response` sends it with its Content-Length and closes it after.

Signed provenance (audio/provenance.py): when the server signs and the finished file is a wav,
mp3 or flac of at most SIGN_MAX_BYTES, `finish` has c2pa read the complete file (header patches
applied: the signature covers the bytes that are sent) from its spooled file and write the signed
one into another, on the encode pool, and the signed file replaces it. A file left unsigned (a
format without a place for a manifest, or too long) goes out with the manifest's claim as the
`X-C2PA-Claim` header, as streams do.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import numpy as np
from starlette.background import BackgroundTask

from higgs_serve.audio.provenance import CLAIM_HEADER, UNSIGNED_HEADER, Provenance
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.server.limits.send_timeout import ClosingStreamingResponse

SPOOL_MEMORY_BYTES = 1 << 20  # 1 MiB: about 20 s of 24 kHz WAV; longer files go to disk
_READ_BLOCK_BYTES = 256 << 10


@dataclass(frozen=True)
class FileSigning:
    """What signs a finished file: the server's Provenance, the file's format, and the pool the
    (blocking) signing runs on."""

    provenance: Provenance
    response_format: str
    workers: AudioWorkers


def _spool() -> tempfile.SpooledTemporaryFile:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES, prefix="higgs-serve-")


class AudioFile:
    def __init__(self, out: AudioOut, signing: FileSigning | None = None):
        self._out = out
        self._signing = signing
        self._file = _spool()
        self.size_bytes = 0
        self._restarts = 0  # the encoding's restarts seen (AudioOut.restarts)
        self.finished = False
        self.signed = False  # carries a C2PA manifest
        self.unsigned_reason: str | None = None  # signing was tried and failed: why

    async def add(self, audio: np.ndarray) -> None:
        """audio: [n] float32 at the model's rate."""
        self._write(await self._out.push(audio))

    async def finish(self) -> None:
        """Flush the pipeline, apply the header patches, sign when the server signs this file
        (module note): the file is complete."""
        self._write(await self._out.close())
        for offset, value in self._out.patches():
            self._file.seek(offset)
            self._file.write(value)
        self._file.seek(0)
        signing = self._signing
        if signing is not None and signing.provenance.can_sign(signing.response_format, self.size_bytes):
            await self._sign(signing)
        self.finished = True

    async def _sign(self, signing: FileSigning) -> None:
        signed = _spool()
        try:
            self.unsigned_reason = await signing.workers.run(signing.provenance.sign_file, self._file,
                                                             signed, signing.response_format)
        except BaseException:
            signed.close()
            raise
        if self.unsigned_reason is not None:  # sent unsigned, with the claim and why (module note)
            signed.close()
            self._file.seek(0)
            return
        self._file.close()
        self._file = signed
        self.size_bytes = signed.seek(0, 2)
        signed.seek(0)
        self.signed = True

    @property
    def claim_headers(self) -> dict[str, str]:
        """The claim header when the server signs but this file carries no manifest, and why
        not when signing it failed (an expired certificate: docs/api.md#provenance-c2pa)."""
        if self._signing is None or self.signed:
            return {}
        why = {} if self.unsigned_reason is None else {UNSIGNED_HEADER: self.unsigned_reason}
        return {CLAIM_HEADER: self._signing.provenance.claim, **why}

    def _write(self, data: bytes) -> None:
        if self._out.restarts != self._restarts:  # `data` is the whole file so far: start over
            self._restarts = self._out.restarts
            self._file.seek(0)
            self._file.truncate()
            self.size_bytes = 0
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
        """Free the memory or the temporary file, and an unfinished pipeline (idempotent)."""
        self._out.release()
        self._file.close()


async def collect_file(audio: AsyncIterator[np.ndarray], out: AudioOut,
                       signing: FileSigning | None = None) -> AudioFile:
    """Every chunk of `audio` into one finished (and, with `signing`, signed where it can be)
    AudioFile; on any failure (or cancellation) the partial file is discarded."""
    file = AudioFile(out, signing)
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
    """A finished AudioFile as the response body, with its Content-Length (and the claim header
    when it is unsigned on a signing server); closed after."""
    return ClosingStreamingResponse(file.blocks(), media_type=media_type,
                                    headers={**headers, **file.claim_headers,
                                             "Content-Length": str(file.size_bytes)},
                                    background=BackgroundTask(file.discard))
