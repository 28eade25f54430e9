"""A streamed response's bytes made ahead of its reader, so the engine's part ends with the
engine's work (docs/api.md#limits).

Streaming bodies are pulled by the response as it writes: a client that stops reading stops the
pull, and the request kept its admission slot until the send timeout ended the response, though
the engine had finished its audio long before (four stalled SSE readers refused every new request
for as long). `read_ahead` pulls the source on a task of its own into a queue: the audio is
encoded as the engine makes it, `when_done` runs the moment the source is exhausted (the caller
frees the slot there), and the reader takes the queued bytes at its own pace; what waits for a
slow reader is bounded by the request's own audio and by the send timeout
(server/limits/send_timeout.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

_END = object()


async def read_ahead(source: AsyncIterator[bytes],
                     when_done: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
    """source's items in order; an exception of source's is raised here, where it happened in
    the order. Closing this generator early cancels the pull (source's own cleanup runs, which
    for a response body closes its generation: the engine request aborted, the slot freed)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pull() -> None:
        try:
            async for item in source:
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
            yield item
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
