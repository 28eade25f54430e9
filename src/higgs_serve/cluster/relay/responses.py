"""Answers from a replica or the control plane, parsed by httptools (llhttp).

The relay passes an answer's body on unchanged, so it only needs to know where the body ends
(Content-Length, chunked framing, or the upstream's close) to reuse the connection; llhttp scans
each piece for that without a Python call per chunk. For an HTTP/1.0 client, which cannot read
chunked framing, the body is decoded instead and the client's response ends with the connection.

An upstream head is split off at its blank line (our own servers write CRLF) and checked whole by
llhttp, which reads its status and framing; it then passes on as the bytes it was, less the
upstream's connection headers. The few fields the relay reads are found in those bytes (once
llhttp has passed them, each field is one CRLF-ended `name: value` line) rather than handed to
Python one callback per field: a head per request, on the path every request takes.
"""

from __future__ import annotations

import asyncio

import httptools

MAX_HEAD_BYTES = 64 * 1024
_CONNECTION = (b"connection", b"keep-alive")
_CONNECTION_AND_CODING = (*_CONNECTION, b"transfer-encoding")


class _Parse:
    """llhttp's callbacks for one response: the end of its head, then of its body."""

    __slots__ = ("parser", "head_done", "complete", "sink")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head_done = self.complete = False
        self.sink = None  # where decoded body bytes go (_Decode)

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
    """A head llhttp accepted: its status, its bytes (through the blank line), and the fields the
    relay reads, found in them (module note)."""

    __slots__ = ("status", "raw", "_lower", "parse")

    def __init__(self, raw: bytes, parse: _Parse):
        self.parse = parse
        self.status = parse.parser.get_status_code()
        self.raw = raw
        self._lower = raw.lower()

    def header(self, name: bytes) -> bytes | None:
        """The first `name` field's value (`name` lower-case), or None."""
        at = self._lower.find(b"\r\n%s:" % name)
        if at < 0:
            return None
        start = at + len(name) + 3
        return self.raw[start:self.raw.index(b"\r\n", start)].strip()

    def for_client(self, keep_alive: bool, dechunked: bool = False) -> bytes:
        """The head as the client gets it: the upstream's connection headers replaced; for a
        body the relay decodes from chunked (an HTTP/1.0 client), no Transfer-Encoding."""
        drop = _CONNECTION_AND_CODING if dechunked else _CONNECTION
        head = self.raw[:-2]  # through the last field's CRLF
        if any(b"\r\n%s:" % name in self._lower for name in drop):
            lines = head.split(b"\r\n")
            head = b"\r\n".join(
                [lines[0]] + [line for line in lines[1:]
                              if line.partition(b":")[0].lower() not in drop])
        return head + (b"\r\n" if keep_alive else b"connection: close\r\n\r\n")

    def switching(self) -> bytes:
        """A 101 passed on whole (its Connection and Upgrade headers are the handshake)."""
        return self.raw


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
    return ResponseHead(raw, parse)


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
