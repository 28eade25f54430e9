"""Connections from the relay (listener.py) to a replica or the control plane, pooled.

An `Upstream` is an asyncio protocol, not a stream: once its answer's head is in, every piece of
the body the socket delivers is written straight to the client's transport from
`data_received`, with no buffer in between and no coroutine woken per piece; a coroutine is woken
only when the body ends, the upstream goes away, or the client falls behind (then reading pauses
until the client's buffer drains: backpressure). Measured against the stream-based relay on the
same run (benchmarks/results/README.md, issue 44) this cut the front end's CPU per relayed
chunk. The body passes unchanged (decoded from chunked only for an HTTP/1.0 client); `ResponseBody`
(responses.py, llhttp) says where it ends, so the connection can be reused for the next request.
"""

from __future__ import annotations

import asyncio
import time

from higgs_serve.cluster.relay.responses import MAX_HEAD_BYTES, ResponseBody, ResponseHead, parse_head

IDLE_REUSE_S = 3.0  # pooled connections older than this are not reused (uvicorn closes at 5 s)
WRITE_HIGH_BYTES = 1024 * 1024  # past this much unsent to the client, stop reading upstream

DONE, LOST, PAUSED = "done", "lost", "paused"


class Collect:
    """A sink that keeps what it is given (a small answer read whole)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


class Upstream(asyncio.Protocol):
    """One connection upstream; one request at a time (module note)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.since = time.monotonic()
        self._head = bytearray()
        self._head_waiter: asyncio.Future | None = None
        self._decode = False  # parse the answer's body for an HTTP/1.0 client (responses.py)
        self._sink = None
        self._follower: ResponseBody | None = None
        self._waiter: asyncio.Future | None = None
        self.sent = 0

    # ------------------------------------------------------------------ asyncio's side
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._sink is not None:
            self._deliver(data)
        elif self._head_waiter is not None and not self._head_waiter.done():
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end >= 0:
                raw, rest = bytes(self._head[:end + 4]), bytes(self._head[end + 4:])
                self._head.clear()
                try:
                    self._head_waiter.set_result((parse_head(raw, self._decode), rest))
                except ConnectionError as error:
                    self._head_waiter.set_exception(error)
            elif len(self._head) > MAX_HEAD_BYTES:
                self._head_waiter.set_exception(ConnectionError("response head too large"))
        else:
            self.reusable = False  # bytes nobody asked for: never reuse this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._head_waiter is not None and not self._head_waiter.done():
            self._head_waiter.set_exception(ConnectionError("the upstream closed"))
        self._wake(LOST)

    def pause_writing(self) -> None:  # our request bodies are small enough to be buffered
        pass

    def resume_writing(self) -> None:
        pass

    # ------------------------------------------------------------------ the relay's side
    async def exchange(self, head_bytes: bytes, body: bytes,
                       decode: bool = False) -> tuple[ResponseHead, bytes]:
        """Send a request; its answer's head and the body bytes that came with it. `decode`: the
        answer's body will be wanted unchunked."""
        self._decode = decode
        self._head_waiter = asyncio.get_running_loop().create_future()
        self.transport.writelines((head_bytes, body))
        try:
            return await self._head_waiter
        finally:
            self._head_waiter = None

    async def forward(self, sink, follower: ResponseBody, first: bytes, drain,
                      timeout_s: float) -> bool:
        """Pass the body to `sink` (a transport) until it ends: True when it ended whole (or,
        for a body delimited by the close, when the upstream closed); False when cut. `drain()`
        waits for the client to read (at most timeout_s: TimeoutError)."""
        self._sink, self._follower, self.sent = sink, follower, 0
        loop = asyncio.get_running_loop()
        try:
            self._waiter = loop.create_future()
            if first:
                self._deliver(first)
            while True:
                if self._waiter.done():
                    state = self._waiter.result()
                elif self.closed:
                    state = LOST
                else:
                    state = await self._waiter
                if state == DONE:
                    return True
                if state == LOST:
                    self.reusable = False
                    return follower.until_close and not sink.is_closing()
                self._waiter = loop.create_future()  # PAUSED: the client fell behind
                await asyncio.wait_for(drain(), timeout_s)
                if not self.closed:
                    self.transport.resume_reading()
        finally:
            self._sink = self._follower = self._waiter = None

    def _deliver(self, data: bytes) -> None:
        sink = self._sink
        if sink.is_closing():  # the client left: end the upstream request (the replica aborts)
            self.abort()
            return
        follower = self._follower
        if not follower.decoded:  # else it writes the data it decodes
            sink.write(data)
        self.sent += len(data)
        if follower.feed(data):
            self._sink = None
            self._wake(DONE)
        elif sink.get_write_buffer_size() > WRITE_HIGH_BYTES:
            self.transport.pause_reading()
            self._wake(PAUSED)

    def _wake(self, state: str) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(state)

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()


class Pool:
    """Keep-alive connections per Unix socket path (most recent first)."""

    def __init__(self) -> None:
        self.idle: dict[str, list[Upstream]] = {}

    async def get(self, path: str) -> tuple[Upstream, bool]:
        """(connection, reused); OSError when the socket cannot be reached."""
        idle = self.idle.get(path)
        now = time.monotonic()
        while idle:
            upstream = idle.pop()
            if now - upstream.since < IDLE_REUSE_S and not upstream.closed:
                return upstream, True
            upstream.abort()
        _, upstream = await asyncio.get_running_loop().create_unix_connection(Upstream, path)
        return upstream, False

    def put(self, path: str, upstream: Upstream) -> None:
        if upstream.closed or not upstream.reusable:
            upstream.abort()
            return
        upstream.since = time.monotonic()
        self.idle.setdefault(path, []).append(upstream)

    def close(self) -> None:
        for idle in self.idle.values():
            for upstream in idle:
                upstream.abort()
        self.idle.clear()
