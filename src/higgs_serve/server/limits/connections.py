"""Client connections, for the single server (uvicorn's httptools protocol, `ServerConnection`)
and the data-parallel front end (cluster/relay/connections.py) alike: a cap below the open-file
limit that keeps room for clients that send a request, and a lingering close after an answer
sent before the request's body was read (docs/operations.md#connections).

- The cap. Each connection costs a file descriptor out of a fixed number; past it the listener
  cannot accept at all, so connections that never send a request would lock every client out
  while they last. Connections are capped below the open-file limit (`connection_cap`), and at
  the cap a newcomer takes the place of the connection that has waited longest without a request
  in hand (`oldest_idle`: idle, or its head still arriving). A client that sends its request at
  once is then served however many idle ones are open; only when every connection is being
  served is the newcomer refused (503, Retry-After).
- The lingering close. An answer given before the body was read (a declared length over the
  limit: server/limits/body_limit.py) is followed by a close; closing a socket with unread data
  sends a reset, and a client still sending its body (urllib, requests: they read only once the
  body is sent) sees the reset instead of the answer. So the server first ends its side
  (a FIN after the answer), reads and discards what still comes for up to LINGER_S, then closes,
  as nginx does.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Iterable
from typing import Protocol, TypeVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from higgs_serve.server.errors import RETRY_AFTER_S, error_object

LINGER_S = 2.0  # how long a refused upload may go on being sent (and discarded)
RESERVED_FDS = 64  # at least, for what a server opens besides connections
MIN_CAP = 16


class Idler(Protocol):
    since: float  # monotonic: since when it has had no request in hand

    @property
    def evictable(self) -> bool: ...


C = TypeVar("C", bound=Idler)


def open_file_limit() -> int:
    """This process's soft limit on open files (unlimited counted as 2**20)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def connection_cap(fds_per_connection: int, reserved_fds: int) -> int:
    """Connections the open-file limit allows at `fds_per_connection` each, less `reserved_fds`."""
    return max(MIN_CAP, (open_file_limit() - reserved_fds) // fds_per_connection)


def server_cap() -> int:
    """The single server's cap: one descriptor a connection; a quarter of the limit (at least
    RESERVED_FDS) is left for its own files (spooled responses and uploads, worker sockets)."""
    return connection_cap(1, max(RESERVED_FDS, open_file_limit() // 4))


def oldest_idle(connections: Iterable[C]) -> C | None:
    """The connection to close for a newcomer: the one that has waited longest without a request
    in hand (None when every one is being served)."""
    return min((c for c in connections if c.evictable), key=lambda c: c.since, default=None)


def too_many_answer(who: str) -> bytes:
    """A 503 for a newcomer refused at the cap, in OpenAI's error shape."""
    body = json.dumps({"error": error_object(f"{who} has too many open connections; retry", "server_error",
                                             None, "too_many_connections")}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nretry-after: %d\r\nconnection: close\r\n\r\n" % (len(body), RETRY_AFTER_S)
            + body)


class ServerConnection(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the cap and the lingering close (module note). uvicorn
    makes one per connection (`http=` in server/app.py's config); `cap` is the server's."""

    def __init__(self, *args, cap: int, **kwargs):
        super().__init__(*args, **kwargs)
        self._cap = cap
        self.since = time.monotonic()
        self.evicted = False
        self._in_message = False  # a request's bytes are arriving (its head or its body)
        self._lingering: asyncio.TimerHandle | None = None

    @property
    def evictable(self) -> bool:
        """No request in hand: idle, or its head still arriving (not yet handed to the app)."""
        return not self.evicted and self._lingering is None and (self.cycle is None or self.cycle.response_complete)

    # ------------------------------------------------------------------ the cap
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn's own set holds every open connection (WebSocket ones too)
        counted = [c for c in self.connections if not (isinstance(c, ServerConnection) and c.evicted)]
        if len(counted) <= self._cap:
            return
        victim = oldest_idle(c for c in counted if isinstance(c, ServerConnection) and c is not self)
        if victim is not None:
            victim.evict()
            return
        self.evicted = True
        transport.write(too_many_answer("the server"))
        self._linger()

    def evict(self) -> None:
        """Closed to make room: nothing is in hand to answer."""
        self.evicted = True
        self.transport.close()

    # ------------------------------------------------------------------ the lingering close
    def on_message_begin(self) -> None:
        self._in_message = True
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:  # its close lingers
            self.cycle.transport = _LingeringClose(self.transport, self)

    def on_response_complete(self) -> None:
        self.since = time.monotonic()  # idle from now
        super().on_response_complete()

    def data_received(self, data: bytes) -> None:
        if self._lingering is None:
            super().data_received(data)  # else discarded: the answer is given

    def close_after_answer(self) -> None:
        """The request's answer is sent and the connection is to close: at once when its body
        was read whole, else after a lingering read (module note)."""
        if self.transport.is_closing():
            return
        if not self._in_message:
            self.transport.close()
            return
        self._linger()

    def _linger(self) -> None:
        transport = self.transport
        self._lingering = self.loop.call_later(LINGER_S, transport.close)
        transport.resume_reading()  # uvicorn pauses reading while a body waits to be read
        if transport.can_write_eof():
            transport.write_eof()  # the answer, then our FIN: the client reads it at its pace

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)


class _LingeringClose:
    """A request's view of its transport: the same, but its close is the lingering one."""

    def __init__(self, transport: asyncio.Transport, connection: ServerConnection):
        self._transport, self._connection = transport, connection

    def close(self) -> None:
        self._connection.close_after_answer()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)
