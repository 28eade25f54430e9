"""Request body limits, enforced while the body arrives: a 413 before an oversized body is held,
and a JSON body measured (json_limits.py) before anything parses it.

FastAPI reads a whole body (JSON or multipart) before the handler runs, so a limit checked in a
handler comes after the memory is spent. `BodyLimitMiddleware` answers 413 at once when
Content-Length is over the route's limit, and otherwise counts the bytes as they are received
and stops the read (413) the moment they pass it, chunked bodies included. A body FastAPI would
parse as JSON (any content type but a form's) is gathered first (it is within the byte limit)
and its shape checked: too deep is a 400 `invalid_json`, too many values a 413
`body_too_large`, before FastAPI's `json.loads` runs on the event loop.
"""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from higgs_serve.server.limits.json_limits import JsonShapeError, JsonTooDeepError, check_json_shape

_FORM_TYPES = (b"multipart/form-data", b"application/x-www-form-urlencoded")


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

        if _header(scope, b"content-type").startswith(_FORM_TYPES):
            await self.app(scope, counting_receive, send)
            return
        try:
            body = await _whole_body(counting_receive)
        except BodyTooLargeError:  # raised here, outside the app's error handlers
            await _send_413(send, limit)
            return
        if body is None:  # the client left while sending
            return
        try:
            check_json_shape(body)
        except JsonShapeError as error:
            status, code = (400, "invalid_json") if isinstance(error, JsonTooDeepError) \
                else (413, "body_too_large")
            await _send_error(send, status, f"the JSON body is {error}; no request is that "
                              "complex (see docs/api.md, Limits)", code)
            return
        await self.app(scope, _replay(body, receive), send)


def _header(scope: Scope, wanted: bytes) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return value.lower()
    return b""


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None  # uvicorn refuses malformed lengths itself


async def _whole_body(receive: Receive) -> bytes | None:
    """The body's bytes (within the limit `receive` enforces), or None on a disconnect."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the connection's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_413(send: Send, limit: int) -> None:
    await _send_error(send, 413, f"request body exceeds the limit of {limit} bytes",
                      "body_too_large")


async def _send_error(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
