"""Request body limits, enforced while the body arrives: a 413 before an oversized body is held.

FastAPI reads a whole body (JSON or multipart) before the handler runs, so a limit checked in a
handler comes after the memory is spent. `BodyLimitMiddleware` answers 413 at once when
Content-Length is over the route's limit, and otherwise counts the bytes as they are received
and stops the read (413) the moment they pass it, chunked bodies included.
"""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLargeError(HTTPException):
    def __init__(self, limit_bytes: int):
        super().__init__(413, f"request body exceeds the limit of {limit_bytes} bytes")


class BodyLimitMiddleware:
    """limits: path -> bytes for the paths with their own limit; `default_bytes` for the rest."""

    def __init__(self, app: ASGIApp, default_bytes: int, limits: dict[str, int]):
        self.app = app
        self.default_bytes = default_bytes
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.get(scope["path"].rstrip("/"), self.default_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_413(send, limit)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(limit)
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # uvicorn refuses malformed lengths itself
    return None


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps({"error": {"message": f"request body exceeds the limit of {limit} bytes",
                                 "type": "invalid_request_error", "param": None,
                                 "code": "body_too_large"}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
