"""Slow readers: every response write must finish within `send_timeout_s`, or the response ends.

A client that stops reading fills the socket buffers; the next write then waits forever, and a
streaming response holding an admission slot (and an engine request) would hold it with it.
`SendTimeoutMiddleware` bounds each ASGI `send` in time; when one times out the response is
abandoned (uvicorn closes the connection) and `ClosingStreamingResponse` closes the body
generator at once, whose `finally` aborts the engine request and releases the slot
(server/run/generation.py). Starlette's own StreamingResponse leaves an interrupted generator to the
garbage collector, which would free the slot only eventually.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


class SendTimeoutError(Exception):
    """A response write did not complete within the send timeout (the client stopped reading)."""


class SendTimeoutMiddleware:
    def __init__(self, app: ASGIApp, send_timeout_s: float):
        self.app = app
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def timed_send(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout_s)
            except TimeoutError as error:
                raise SendTimeoutError() from error

        try:
            await self.app(scope, receive, timed_send)
        except SendTimeoutError:
            # the response is incomplete: uvicorn closes the connection when we return
            logger.warning("%s %s: the client read nothing for %.0f s; response abandoned",
                           scope.get("method"), scope.get("path"), self.send_timeout_s)


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body generator however streaming ends."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
