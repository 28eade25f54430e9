"""Answers from a replica or the control plane, parsed by httptools (llhttp).

The relay passes an answer's body on unchanged, so it only needs to know where the body ends
(Content-Length, chunked framing, or the upstream's close) to reuse the connection; llhttp scans
each piece for that without a Python call per chunk. For an HTTP/1.0 client, which cannot read
chunked framing, the body is decoded instead and the client's response ends with the connection.
Upstream heads are split off at their blank line (our own servers write CRLF) and parsed whole.
"""

from __future__ import annotations

import asyncio

import httptools

MAX_HEAD_BYTES = 64 * 1024
_DROP = (b"connection", b"keep-alive")
_DROP_DECODED = (*_DROP, b"transfer-encoding")


class _Parse:
    """llhttp's callbacks for one response: its head, then the end of its body."""

    __slots__ = ("parser", "reason", "headers", "head_done", "complete", "sink")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = self.complete = False
        self.sink = None  # where decoded body bytes go (_Decode)

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:  # not a trailer field
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_message_complete(self) -> None:
        self.complete = True


class _Decode(_Parse):
    """The same, handing the body's data (unchunked) to `sink`."""

    __slots__ = ()

    def on_body(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink.write(data)


class ResponseHead:
    __slots__ = ("status", "status_line", "headers", "parse")

    def __init__(self, parse: _Parse):
        self.parse = parse
        self.status = parse.parser.get_status_code()
        self.status_line = b"HTTP/%s %d %s" % (parse.parser.get_http_version().encode(),
                                                self.status, parse.reason)
        self.headers = parse.headers  # (lower-cased name, value)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def for_client(self, keep_alive: bool, dechunked: bool = False) -> bytes:
        """The head as the client gets it: the upstream's connection headers replaced; for a
        body the relay decodes from chunked (an HTTP/1.0 client), no Transfer-Encoding."""
        drop = _DROP_DECODED if dechunked else _DROP
        lines = [self.status_line]
        lines += [b"%s: %s" % pair for pair in self.headers if pair[0] not in drop]
        if not keep_alive:
            lines.append(b"connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def switching(self) -> bytes:
        """A 101 passed on whole (its Connection and Upgrade headers are the handshake)."""
        return self.status_line + b"\r\n" + \
            b"".join(b"%s: %s\r\n" % pair for pair in self.headers) + b"\r\n"


def parse_head(raw: bytes, decode: bool = False) -> ResponseHead:
    """A response head (through its blank line); ConnectionError when it is not one. `decode`:
    the body's data will be wanted unchunked (ResponseBody.decoded)."""
    parse = _Decode() if decode else _Parse()
    try:
        parse.parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass  # a 101: what follows is the other protocol's
    except httptools.HttpParserError as error:
        raise ConnectionError(f"malformed response from upstream: {error}") from None
    if not parse.head_done:
        raise ConnectionError("malformed response head from upstream")
    return ResponseHead(parse)


async def read_head(reader: asyncio.StreamReader, decode: bool = False) -> ResponseHead:
    return parse_head(await reader.readuntil(b"\r\n\r\n"), decode)


class ResponseBody:
    """Where a response body ends. `feed(data)` with each piece as it arrives: True once the body
    is complete. `decoded` (a chunked body whose head was parsed with `decode`): its data goes to
    `sink` unchunked (an HTTP/1.0 client); otherwise the caller passes the pieces on as they are."""

    __slots__ = ("_parse", "chunked", "until_close", "empty", "decoded")

    def __init__(self, head: ResponseHead, method: bytes, sink=None):
        parse = self._parse = head.parse
        self.chunked = head.header(b"transfer-encoding") is not None
        self.empty = method == b"HEAD" or parse.complete or head.status in (101, 204, 304)
        self.until_close = not self.empty and not self.chunked and \
            head.header(b"content-length") is None
        self.decoded = self.chunked and isinstance(parse, _Decode)
        if self.decoded:
            parse.sink = sink

    def feed(self, data: bytes) -> bool:
        if self.until_close:
            return False
        try:
            self._parse.parser.feed_data(data)
        except httptools.HttpParserError as error:
            raise ConnectionError(f"malformed response body from upstream: {error}") from None
        return self._parse.complete


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
            head = await read_head(reader, decode=True)
            parts: list[bytes] = []
            body = ResponseBody(head, b"GET", sink=_Parts(parts))
            while not body.empty:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if not body.decoded:
                    parts.append(data)
                if body.feed(data):
                    break
            return head.status, b"".join(parts)
        finally:
            writer.transport.abort()

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except (EOFError, asyncio.LimitOverrunError, ConnectionError) as error:
        raise OSError(f"bad answer from {socket_path}: {error}") from None


class _Parts:
    __slots__ = ("parts",)

    def __init__(self, parts: list[bytes]):
        self.parts = parts

    def write(self, data: bytes) -> None:
        self.parts.append(data)
