"""HTTP/1.1 as the front end's relay (cluster/relay.py) speaks it, over asyncio streams.

Only what the relay needs: request and response heads, a request body by Content-Length or
chunked (counted against a limit while it arrives), and following a response body that passes
through unchanged (Content-Length, chunked, or until the upstream closes) to know where it ends.
Header names are lower-cased once; values stay bytes (latin-1 on the wire), so no header can make
the relay raise a decoding error.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass

from higgs_serve.server.errors import error_object

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; past it 431
# Not passed on: they describe one hop, not the message (RFC 9110 7.6.1), or belong to the
# client's side only (its key: replicas sit on private sockets and take no key).
HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"host",
                         b"content-length", b"te", b"trailer", b"proxy-authorization",
                         b"proxy-authenticate", b"expect"})
_NO_BODY_STATUS = frozenset({204, 304})


class HttpError(Exception):
    """A request the relay answers itself (status, OpenAI error type/code), then closes."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.type = status, message, code, type
        self.headers = headers or {}


@dataclass(slots=True)
class Request:
    method: bytes
    target: bytes                      # path and query, as sent
    path: str                          # without the query
    version: bytes                     # b"HTTP/1.1"
    headers: list[tuple[bytes, bytes]]  # (lower-cased name, value)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def keep_alive(self) -> bool:
        connection = (self.header(b"connection") or b"").lower()
        if self.version == b"HTTP/1.0":
            return b"keep-alive" in connection
        return b"close" not in connection

    @property
    def upgrade(self) -> bool:
        return self.header(b"upgrade") is not None and \
            b"upgrade" in (self.header(b"connection") or b"").lower()


@dataclass(slots=True)
class ResponseHead:
    status: int
    raw_status_line: bytes
    headers: list[tuple[bytes, bytes]]

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def _split_headers(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    headers = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line", code="bad_request")
        headers.append((name.lower(), value.strip()))
    return headers


async def read_request_head(reader: asyncio.StreamReader) -> Request | None:
    """The next request's head; None when the client closed between requests."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if not error.partial.strip():
            return None
        raise HttpError(400, "incomplete request head", code="bad_request") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request head exceeds {MAX_HEAD_BYTES} bytes",
                        code="headers_too_large") from None
    lines = raw[:-4].split(b"\r\n")
    while lines and not lines[0]:  # RFC 9112 2.2: ignore empty lines before a request line
        lines.pop(0)
    parts = lines[0].split(b" ") if lines else []
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise HttpError(400, "malformed request line", code="bad_request")
    method, target, version = parts
    path = target.split(b"?", 1)[0].decode("latin-1")
    return Request(method, target, path, version, _split_headers(lines[1:]))


def declared_length(request: Request) -> int | None:
    """The body's Content-Length; None when chunked or absent (no body)."""
    value = request.header(b"content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise HttpError(400, "invalid Content-Length", code="bad_request")
    return int(value)


def is_chunked(headers) -> bool:
    value = next((v for k, v in headers if k == b"transfer-encoding"), None)
    return value is not None and value.lower().rstrip().endswith(b"chunked")


async def read_body(reader: asyncio.StreamReader, request: Request, limit_bytes: int) -> bytes:
    """The whole request body, refused (413) as soon as it is known to pass `limit_bytes`."""
    if is_chunked(request.headers):
        return await _read_chunked(reader, limit_bytes)
    length = declared_length(request) or 0
    if length > limit_bytes:
        raise too_large(limit_bytes)
    return await reader.readexactly(length) if length else b""


async def _read_chunked(reader: asyncio.StreamReader, limit_bytes: int) -> bytes:
    parts, total = [], 0
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise HttpError(400, "malformed chunk size", code="bad_request") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields: dropped
                pass
            return b"".join(parts)
        total += size
        if total > limit_bytes:
            raise too_large(limit_bytes)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError(400, "malformed chunk", code="bad_request")


def too_large(limit_bytes: int) -> HttpError:
    # the single server's words and code (server/limits/body_limit.py)
    return HttpError(413, f"request body exceeds the limit of {limit_bytes} bytes",
                     code="body_too_large")


def upstream_request(request: Request, body: bytes, extra: list[tuple[bytes, bytes]] = (),
                     drop: frozenset[bytes] = HOP_HEADERS) -> bytes:
    """The head to send upstream: the client's headers less `drop`, then the body's length."""
    lines = [b"%s %s HTTP/1.1" % (request.method, request.target), b"host: replica"]
    lines += [b"%s: %s" % pair for pair in request.headers if pair[0] not in drop]
    lines += [b"%s: %s" % pair for pair in extra]
    if body or request.method not in (b"GET", b"HEAD"):
        lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def read_response_head(reader: asyncio.StreamReader) -> ResponseHead:
    return parse_response_head(await reader.readuntil(b"\r\n\r\n"))


def parse_response_head(raw: bytes) -> ResponseHead:
    """A response head (ending in the blank line); ConnectionError when it is not one."""
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ConnectionError("malformed response from upstream")
    try:
        headers = _split_headers(lines[1:])
    except HttpError:
        raise ConnectionError("malformed response header from upstream") from None
    return ResponseHead(int(parts[1]), lines[0], headers)


def client_head(head: ResponseHead, keep_alive: bool) -> bytes:
    """The upstream's head as the client gets it: its own connection headers replaced."""
    lines = [head.raw_status_line]
    lines += [b"%s: %s" % pair for pair in head.headers
              if pair[0] not in (b"connection", b"keep-alive")]
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class BodyFollower:
    """Where a response body that passes through unchanged ends. `feed(data)` with each piece as
    it arrives: True once the body is complete. Chunked bodies are scanned for their framing
    (sizes, the last chunk, the trailer), nothing is copied or decoded."""

    __slots__ = ("remaining", "chunked", "until_close", "_line", "_trailer")

    def __init__(self, head: ResponseHead, method: bytes):
        self.chunked = is_chunked(head.headers)
        self.until_close = False
        self._line = b""
        self._trailer = False
        length = head.header(b"content-length")
        if method == b"HEAD" or head.status in _NO_BODY_STATUS or head.status < 200:
            self.remaining = 0
        elif self.chunked:
            self.remaining = 0  # bytes left in the current chunk's data and its CRLF
        elif length is not None and length.isdigit():
            self.remaining = int(length)
        else:
            self.until_close = True  # delimited by the upstream's close
            self.remaining = 0

    @property
    def empty(self) -> bool:
        return not self.chunked and not self.until_close and self.remaining == 0

    def feed(self, data: bytes) -> bool:
        if self.until_close:
            return False
        if not self.chunked:
            self.remaining -= len(data)
            return self.remaining <= 0
        i, n = 0, len(data)
        while i < n:
            if self.remaining:
                step = min(self.remaining, n - i)
                self.remaining -= step
                i += step
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self._line += data[i:]
                if len(self._line) > 4096:
                    raise ConnectionError("malformed chunked body from upstream")
                return False
            line = (self._line + data[i:j]).rstrip(b"\r")
            self._line = b""
            i = j + 1
            if self._trailer:
                if not line:
                    return True
                continue
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise ConnectionError("malformed chunked body from upstream") from None
            if size == 0:
                self._trailer = True
            else:
                self.remaining = size + 2
        return False


def error_bytes(error: HttpError, keep_alive: bool = False) -> bytes:
    """An answer of the relay's own, in the OpenAI error shape (server/errors.py)."""
    body = json.dumps({"error": error_object(error.message, error.type, None, error.code)}).encode()
    reason = {400: b"Bad Request", 401: b"Unauthorized", 413: b"Content Too Large",
              429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
              503: b"Service Unavailable"}.get(error.status, b"Error")
    lines = [b"HTTP/1.1 %d %s" % (error.status, reason), b"content-type: application/json",
             b"content-length: %d" % len(body)]
    lines += [b"%s: %s" % (k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def bearer_ok(authorization: bytes | None, expected: bytes) -> bool:
    """The single server's key rule (server/app.py): `Bearer <key>`, compared as bytes, so any
    header value (non-ASCII included) is a yes or a no, never an error."""
    scheme, _, token = (authorization or b"").partition(b" ")
    return scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), expected)


async def fetch(socket_path: str, target: str, timeout_s: float) -> tuple[int, bytes]:
    """GET `target` over a Unix socket: (status, body). Raises OSError (or TimeoutError) when
    the server cannot be reached or answers in time. The supervisor's polls: a tenth of an
    httpx request's CPU, which at 8 replicas x 2 polls x 2 a second was most of an idle front
    end's."""
    async def exchange() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_unix_connection(socket_path)
        try:
            writer.write(b"GET %s HTTP/1.1\r\nhost: replica\r\nconnection: close\r\n\r\n"
                         % target.encode())
            head = await read_response_head(reader)
            follower, parts = BodyFollower(head, b"GET"), []
            while not follower.empty:
                data = await reader.read(1 << 16)
                if not data:
                    break
                parts.append(data)
                if follower.feed(data):
                    break
            body = b"".join(parts)
            return head.status, _dechunk(body) if follower.chunked else body
        finally:
            writer.transport.abort()

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except (EOFError, asyncio.LimitOverrunError, ConnectionError) as error:
        raise OSError(f"bad answer from {socket_path}: {error}") from None


def _dechunk(body: bytes) -> bytes:
    parts, i = [], 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j].split(b";", 1)[0], 16)
        if size == 0:
            return b"".join(parts)
        parts.append(body[j + 2: j + 2 + size])
        i = j + 2 + size + 2
