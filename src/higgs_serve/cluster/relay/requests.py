"""Client requests off one connection, parsed by httptools (llhttp, the parser uvicorn runs).

llhttp already refuses what RFC 9112 asks a server to refuse (docs/scaling-out.md, "The front
end's HTTP"): Content-Length with Transfer-Encoding, a duplicate or malformed Content-Length, a
transfer coding list that does not end in chunked, whitespace before a colon, obs-fold, a header
line without a name or a colon, control characters, chunk sizes with a sign, `0x`, `_` or spaces,
chunk lines without CRLF. Each is a 400 here, and the listener closes the connection after it.
What llhttp leaves to its user is checked here:
- sizes: a target over MAX_TARGET_BYTES is a 414, a head over MAX_HEAD_BYTES a 431; chunk
  extensions and trailers (which llhttp skips without a bound) over MAX_FRAMING_BYTES plus a
  few bytes a chunk are a 400;
- a connection that ends inside a head or a body: a 400.
Versions, transfer codings, timeouts and the order of the checks are the listener's
(cluster/relay/listener.py).

The parser is fed in slices of SLICE_BYTES while a head or a chunked body is being read, so that
those bytes are counted to within a slice (llhttp reports no offsets); a Content-Length body is
fed whole.
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

from higgs_serve.cluster.relay.wire import HOP_HEADERS, HttpError, too_large

READ_BYTES = 64 * 1024
SLICE_BYTES = 4096
MAX_TARGET_BYTES = 16 * 1024  # RFC 9112 3: at least 8,000 octets should be accepted
MAX_HEAD_BYTES = 64 * 1024  # request line and header fields
MAX_FRAMING_BYTES = 16 * 1024  # chunk extensions and trailer fields of one body, beyond...
FRAMING_PER_CHUNK = 32  # ...a size line and its CRLFs per chunk


class Request:
    """One request as parsed: its head, then its body as it arrives."""

    __slots__ = ("method", "target", "origin", "path", "version", "headers", "keep_alive",
                 "upgrade", "head_complete", "complete", "body", "body_bytes", "chunks",
                 "head_fed", "framing_fed", "error")

    def __init__(self) -> None:
        self.method = b""
        self.target = b""                  # as sent
        self.origin = b""                  # in origin form, and
        self.path = ""                     # its path normalized: the listener's (server/auth.py)
        self.version = ""                  # "1.1"
        self.headers: list[tuple[bytes, bytes]] = []  # (lower-cased name, value)
        self.keep_alive = True
        self.upgrade = False
        self.head_complete = False
        self.complete = False
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.chunks = 0
        self.head_fed = 0       # bytes fed while the head was incomplete (to within a slice)
        self.framing_fed = 0    # bytes of a chunked body that were not data (to within a slice)
        self.error: HttpError | None = None  # this request's own fault, found while reading

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def values(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]

    @property
    def chunked(self) -> bool:
        return self.header(b"transfer-encoding") is not None  # llhttp: chunked comes last

    @property
    def declared_length(self) -> int | None:
        value = self.header(b"content-length")
        return int(value) if value is not None else None  # llhttp checked: digits, one value

    @property
    def declares_body(self) -> bool:
        return self.chunked or bool(self.declared_length)

    def upstream_head(self, body: bytes, drop: frozenset[bytes] = HOP_HEADERS) -> bytes:
        """The head to send upstream: origin-form target, the client's headers less `drop`,
        then the body's length."""
        lines = [b"%s %s HTTP/1.1" % (self.method, self.origin), b"host: replica"]
        lines += [b"%s: %s" % pair for pair in self.headers if pair[0] not in drop]
        if body or self.method not in (b"GET", b"HEAD"):
            lines.append(b"content-length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def upgrade_head(self) -> bytes:
        """A WebSocket upgrade as the control plane gets it: every header the client sent."""
        lines = [b"%s %s HTTP/1.1" % (self.method, self.origin), b"host: frontend"]
        lines += [b"%s: %s" % pair for pair in self.headers if pair[0] != b"host"]
        return b"\r\n".join(lines) + b"\r\n\r\n"


class RequestReader:
    """The requests of one client connection, in order (pipelined ones queue behind)."""

    __slots__ = ("reader", "rest", "upgraded", "_parser", "_current", "_headers", "_ready",
                 "_error")

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.rest = b""           # after an upgrade's head: the tunnel's first bytes
        self.upgraded = False
        self._parser = httptools.HttpRequestParser(self)
        self._current: Request | None = None  # the message llhttp is inside
        self._headers: list = []  # where its header fields go (its trailer fields: dropped)
        self._ready: deque[Request] = deque()  # heads complete, not yet taken
        self._error: HttpError | None = None

    @property
    def in_message(self) -> bool:
        """A request has begun and not ended."""
        return self._current is not None

    async def head(self) -> Request | None:
        """The next request's head (with whatever body came with it); None when the client
        closed between requests. HttpError for a malformed or oversized head."""
        while not self._ready:
            if self._error is not None:
                raise self._error
            data = await self.reader.read(READ_BYTES)
            if not data:
                if self._current is not None:
                    raise HttpError(400, "the connection ended inside a request head",
                                    code="bad_request")
                return None
            self._feed(data)
        return self._ready.popleft()

    async def body(self, request: Request, limit_bytes: int, grace_s: float,
                   min_bytes_per_s: float) -> bytes:
        """The whole body, refused (413) once it passes `limit_bytes`; 408 when it falls behind
        `min_bytes_per_s` after `grace_s` (every byte received buys time), 400 when the
        connection ends first."""
        loop = asyncio.get_running_loop()
        start = loop.time() + grace_s
        while not request.complete:
            if request.body_bytes > limit_bytes:
                raise too_large(limit_bytes)
            if self._error is not None:
                raise self._error
            left = start + request.body_bytes / min_bytes_per_s - loop.time()
            try:
                data = await asyncio.wait_for(self.reader.read(READ_BYTES), max(left, 0))
            except (TimeoutError, asyncio.TimeoutError):
                raise HttpError(408, f"the request body did not arrive in time (it must keep "
                                f"coming at {min_bytes_per_s / 1024:.0f} KiB/s after the first "
                                f"{grace_s:g} s)", code="request_timeout") from None
            if not data:
                raise HttpError(400, "the connection ended inside the request body",
                                code="incomplete_body")
            self._feed(data)
        if request.error is not None:
            raise request.error
        if request.body_bytes > limit_bytes:
            raise too_large(limit_bytes)
        return b"".join(request.body)

    # ------------------------------------------------------------------ feeding llhttp
    def _feed(self, data: bytes) -> None:
        view, start, end = data if len(data) <= SLICE_BYTES else memoryview(data), 0, len(data)
        while start < end and self._error is None and not self.upgraded:
            request = self._current
            in_body = request is not None and request.head_complete
            precise = not in_body or request.chunked
            stop = min(start + SLICE_BYTES, end) if precise else end
            body_before = request.body_bytes if in_body else 0
            try:
                self._parser.feed_data(view if stop - start == end else view[start:stop])
            except httptools.HttpParserUpgrade as upgrade:
                self.rest = bytes(view[start + upgrade.args[0]:])
                self.upgraded = True
                return
            except httptools.HttpParserCallbackError as error:
                cause = error.__context__
                self._fail(cause if isinstance(cause, HttpError) else _malformed(error))
                return
            except httptools.HttpParserError as error:
                self._fail(_malformed(error))
                return
            self._count(request, in_body, stop - start, body_before)
            start = stop

    def _count(self, request: Request | None, in_body: bool, fed: int, body_before: int) -> None:
        """Bytes of the slice just fed, against the head and framing bounds (module note): a
        head is bounded to within a slice, as the framing is."""
        now = self._current
        if now is not None and not now.head_complete:  # a head still arriving
            now.head_fed = now.head_fed + fed if now is request else fed
            if now.head_fed > MAX_HEAD_BYTES:
                self._fail(_head_too_large(now))
        elif in_body and request.chunked and now in (request, None):  # the slice was its body's
            request.framing_fed += fed - (request.body_bytes - body_before)
            if request.framing_fed > MAX_FRAMING_BYTES + FRAMING_PER_CHUNK * request.chunks:
                self._fail(HttpError(400, "the chunked body's extensions and trailer fields "
                                          f"exceed {MAX_FRAMING_BYTES} bytes",
                                     code="bad_request"), request)

    def _fail(self, error: HttpError, request: Request | None = None) -> None:
        self._error = error
        owner = request or self._current
        if owner is not None:
            owner.error = error

    # ------------------------------------------------------------------ llhttp's callbacks
    def on_message_begin(self) -> None:
        self._current = request = Request()
        self._headers = request.headers

    def on_url(self, piece: bytes) -> None:
        request = self._current
        request.target += piece
        if len(request.target) > MAX_TARGET_BYTES:
            raise HttpError(414, f"the request target exceeds {MAX_TARGET_BYTES} bytes",
                            code="uri_too_long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        request, parser = self._current, self._parser
        self._headers = []  # trailer fields go here, unread (their bytes count as framing)
        request.method = parser.get_method()
        request.version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        request.upgrade = parser.should_upgrade()
        request.head_complete = True
        self._ready.append(request)

    def on_body(self, data: bytes) -> None:
        request = self._current
        request.body.append(data)
        request.body_bytes += len(data)

    def on_chunk_header(self) -> None:
        self._current.chunks += 1

    def on_message_complete(self) -> None:
        self._current.complete = True
        self._current = None


def _head_too_large(request: Request) -> HttpError:
    if len(request.target) > MAX_TARGET_BYTES // 2 and not request.headers:
        return HttpError(414, f"the request target exceeds {MAX_TARGET_BYTES} bytes",
                         code="uri_too_long")
    return HttpError(431, f"the request head exceeds {MAX_HEAD_BYTES} bytes",
                     code="headers_too_large")


def _malformed(error: Exception) -> HttpError:
    # llhttp's reason names the fault in its own words ("Invalid header token", ...)
    return HttpError(400, f"malformed request: {error}", code="bad_request")
