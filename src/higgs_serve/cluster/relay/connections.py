"""The relay's client connections: what each is doing, and the cap on how many are open.

Every connection costs the front end a file descriptor (two while it is relayed: its upstream's
too) out of a fixed number, and past that number the listener could not accept even a /health
probe. So connections are capped below the open-file limit (`default_cap`). At the cap a new
connection takes the place of the oldest one that is idle or still sending its request (a slow
or stalled client; it is answered 503 and closed), so a client that sends its request at once is
served however many slow ones are open; when every open connection is being served, the
newcomer gets the 503 instead (docs/scaling-out.md, "The front end's HTTP"). The budget and the
choice are the single server's too (server/limits/connections.py).
"""

from __future__ import annotations

import asyncio
import time

from higgs_serve.cluster.relay.requests import RequestReader
from higgs_serve.cluster.relay.upstream import Upstream
from higgs_serve.cluster.relay.wire import HttpError, error_bytes
from higgs_serve.server.limits.connections import RESERVED_FDS, connection_cap, oldest_idle

IDLE, READING, SERVING, TUNNEL = "idle", "reading", "serving", "tunnel"


def default_cap() -> int:
    """Connections the open-file limit allows, two descriptors each, less RESERVED_FDS (the
    control plane, the replicas' pipes and sockets, logs, the supervisor)."""
    return connection_cap(2, RESERVED_FDS)


def too_many() -> HttpError:
    return HttpError(503, "the front end has too many open connections; retry",
                     code="too_many_connections", type="server_error",
                     headers={"Retry-After": "1"})


class Conn:
    """One client connection: its streams and requests, its stage, the upstream to cut when it
    is lost."""

    __slots__ = ("reader", "writer", "requests", "lost", "upstream", "stage", "since",
                 "timed_out")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.requests = RequestReader(reader)
        self.lost = False
        self.upstream: Upstream | None = None
        self.stage = IDLE
        self.since = time.monotonic()  # when it entered its stage
        self.timed_out = False  # closed by the listener (a timeout, or evicted): answer nothing

    @property
    def busy(self) -> bool:
        return self.stage in (READING, SERVING)

    @property
    def evictable(self) -> bool:
        """Idle, or still sending its request: it may be closed for a newcomer at the cap."""
        return self.stage in (IDLE, READING)

    @property
    def sending(self) -> bool:
        """In the middle of sending a request (its head or its body)."""
        return self.stage == READING or (self.stage == IDLE and self.requests.in_message)

    def enter(self, stage: str) -> None:
        self.stage, self.since = stage, time.monotonic()

    def on_lost(self, waiter: asyncio.Future) -> None:
        if not waiter.cancelled():
            waiter.exception()  # retrieved: a reset is how clients leave
        self.lost = True
        if self.upstream is not None:
            self.upstream.abort()  # the replica sees its client leave and aborts

    def close_with(self, error: HttpError | None) -> None:
        """Answer (when there is something to say) and close, from outside the connection's
        own task; the task then finds the connection closed and ends."""
        self.timed_out = True
        transport = self.writer.transport
        if error is not None and not transport.is_closing():
            transport.write(error_bytes(error))
        transport.close()


class Connections:
    """The open connections, at most `cap` (module note)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.open: set[Conn] = set()

    def admit(self, conn: Conn) -> bool:
        """Take `conn` in, making room if needed; False when there is none."""
        if len(self.open) >= self.cap:
            victim = oldest_idle(self.open)
            if victim is None:
                return False
            self.open.discard(victim)
            victim.close_with(too_many() if victim.sending else None)
        self.open.add(conn)
        return True

    def discard(self, conn: Conn) -> None:
        self.open.discard(conn)

    def __iter__(self):
        return iter(list(self.open))
