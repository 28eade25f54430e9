"""A streamed response's bytes made ahead of its reader, so the engine's part ends with the
engine's work (docs/api.md#limits).

Streaming bodies are pulled by the response as it writes: a client that stops reading stops the
pull, and the request kept its admission slot until the send timeout ended the response, though
the engine had finished its audio long before (four stalled SSE readers refused every new request
for as long). `read_ahead` pulls the source on a task of its own into a queue: the audio is
encoded as the engine makes it, `when_done` runs the moment the source is exhausted (the caller
frees the slot there), and the reader takes the queued bytes at its own pace. What waits for a
slow reader is bounded: at most READ_AHEAD_BYTES a response (a freed slot must not let stalled
readers pile up audio without end); a response larger than that, unread, pauses its pull, keeps
its slot and is ended by the send timeout (server/limits/send_timeout.py), its engine work
aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

_END = object()
# 4 MiB: 87 s of 24 kHz s16 pcm, several minutes of any compressed format: every reply of the
# usual sizes is made ahead whole, while a stalled reader holds a few MB at most
READ_AHEAD_BYTES = 4 << 20


async def read_ahead(source: AsyncIterator[bytes], when_done: Callable[[], None] | None = None,
                     max_bytes: int = READ_AHEAD_BYTES) -> AsyncIterator[bytes]:
    """source's items in order; an exception of source's is raised here, where it happened in
    the order. The pull waits while more than `max_bytes` are queued. Closing this generator
    early cancels the pull (source's own cleanup runs, which for a response body closes its
    generation: the engine request aborted, the slot freed)."""
    queue: asyncio.Queue = asyncio.Queue()
    queued = 0
    room = asyncio.Event()

    async def pull() -> None:
        nonlocal queued
        try:
            async with contextlib.aclosing(source):  # cancelled between items too: closed now
                async for item in source:
                    while queued >= max_bytes:
                        room.clear()
                        await room.wait()
                    queued += len(item)
                    queue.put_nowait(item)
            if when_done is not None:
                when_done()
            queue.put_nowait(_END)
        except BaseException as error:  # handed to the reader, in order
            queue.put_nowait(error)
            if not isinstance(error, Exception):
                raise

    task = asyncio.create_task(pull())
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            queued -= len(item)
            room.set()
            yield item
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
