"""The relay's own answers (in the OpenAI error shape), and the headers that never pass a hop.
Requests and responses are parsed by llhttp, and written again by requests.py and responses.py.
"""

from __future__ import annotations

import json

from higgs_serve.server.errors import error_object

# Not passed on: they describe one hop, not the message (RFC 9110 7.6.1), or belong to the
# client's side only (its key: replicas sit on private sockets and take no key).
HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"host",
                         b"content-length", b"te", b"trailer", b"proxy-authorization",
                         b"proxy-authenticate", b"expect"})
_REASONS = {400: b"Bad Request", 401: b"Unauthorized", 408: b"Request Timeout",
            413: b"Content Too Large", 414: b"URI Too Long", 429: b"Too Many Requests",
            431: b"Request Header Fields Too Large", 501: b"Not Implemented",
            503: b"Service Unavailable", 505: b"HTTP Version Not Supported"}


class HttpError(Exception):
    """A request the relay answers itself (status, OpenAI error type/code), then closes."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.type = status, message, code, type
        self.headers = headers or {}


def too_large(limit_bytes: int) -> HttpError:
    # the single server's words and code (server/limits/body_limit.py)
    return HttpError(413, f"request body exceeds the limit of {limit_bytes} bytes",
                     code="body_too_large")


def error_bytes(error: HttpError, keep_alive: bool = False) -> bytes:
    """An answer of the relay's own, in the OpenAI error shape (server/errors.py)."""
    body = json.dumps({"error": error_object(error.message, error.type, None, error.code)}).encode()
    lines = [b"HTTP/1.1 %d %s" % (error.status, _REASONS.get(error.status, b"Error")),
             b"content-type: application/json", b"content-length: %d" % len(body)]
    lines += [b"%s: %s" % (k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
