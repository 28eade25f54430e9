"""The front end's data plane: the public HTTP/1.1 listener, relaying speech to the replicas.

Why not Starlette + httpx (the front end until issue 44): at c = 64 half its CPU went to httpcore
rescanning its pool on every request start and end, and the relay cost as much CPU as the replica
spent serving the stream. Measured side by side on eight fake replicas (benchmarks/results,
relay_8_fakes.json; docs/api.md, "Several replicas behind one endpoint"), this relay spends a
fraction of that per audio-second and per request.

What it does, per request on a client connection (keep-alive, one request at a time):
- checks, before reading any body: the API key on every /v1 route (the single server's rule, as
  bytes, so no header makes it fail), and the single server's body limits (413 at once on a
  declared length over the limit; a chunked body is counted while it arrives);
- `POST /v1/audio/speech` and `/v1/audio/speech/batch`: reads the body, takes its affinity key
  (cluster/routing.py, the one policy), and sends it to the chosen replica over that replica's
  private Unix socket, on a pooled keep-alive connection. Before any byte came back it tries
  another replica on a replica it cannot reach (marked down), a connection that fails (not
  marked down: a reset while the body was sent says nothing about the replica's health), 429 or
  503. The answer passes through unchanged (status, headers, body framing), chunk by chunk, with
  backpressure; a client that leaves closes the upstream connection, which aborts the engine
  request;
- everything else (voices, watermark detection, health, metrics, models, the WebSocket) goes
  unchanged to the control
  plane (cluster/control.py) on its private socket; a WebSocket upgrade becomes a byte tunnel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from higgs_serve.cluster.control import no_replica
from higgs_serve.cluster.http1 import (
    HOP_HEADERS,
    BodyFollower,
    HttpError,
    Request,
    ResponseHead,
    bearer_ok,
    client_head,
    declared_length,
    error_bytes,
    read_body,
    read_request_head,
    read_response_head,
    too_large,
    upstream_request,
)
from higgs_serve.cluster.routing import RETRYABLE_STATUS, batch_routing_key, body_key, routing_key
from higgs_serve.cluster.upstream import Collect, Pool, Upstream
from higgs_serve.cluster.ws_relay import PATH as WS_PATH
from higgs_serve.server.routers.watermark import DETECT_PATH
from higgs_serve.server.errors import RETRY_AFTER_S

if TYPE_CHECKING:
    from higgs_serve.cluster.state import Frontend

logger = logging.getLogger(__name__)

ROUTED: Mapping[str, Callable[[dict], str | None]] = {
    "/v1/audio/speech": routing_key, "/v1/audio/speech/batch": batch_routing_key}
CLIENT_IDLE_S = 5.0      # a kept-alive client connection with no new request is closed (uvicorn's)
READ_BYTES = 256 * 1024
LINGER_S = 2.0  # how long a refused upload may go on being sent (and discarded)
# to a replica: not the client's key (replicas take none) nor its hop headers
_TO_REPLICA_DROP = HOP_HEADERS | {b"authorization"}
_UNAUTHORIZED = "missing or invalid API key: send 'Authorization: Bearer <key>'"


class ReplicaUnreachable(Exception):
    """No connection to the replica's socket: it is down."""


class UpstreamFailed(Exception):
    """The connection failed after it was made, before a response head came back."""


class _Conn:
    """One client connection: its streams, and the upstream to cut when it is lost."""

    __slots__ = ("reader", "writer", "lost", "upstream", "busy", "tunnel")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.lost = False
        self.upstream: Upstream | None = None
        self.busy = False  # a request is being served
        self.tunnel = False  # a WebSocket session: the control plane closes it on shutdown

    def on_lost(self, waiter: asyncio.Future) -> None:
        if not waiter.cancelled():
            waiter.exception()  # retrieved: a reset is how clients leave
        self.lost = True
        if self.upstream is not None:
            self.upstream.abort()  # the replica sees its client leave and aborts


class Relay:
    """The data plane of one front end (module note). `serve` it on a listening socket."""

    def __init__(self, frontend: Frontend, control_socket: Path):
        self.frontend = frontend
        self.control_socket = str(control_socket)
        settings = frontend.settings
        self.api_key = settings.api_key.encode() if settings.api_key else None
        self.json_limit_bytes = settings.max_json_body_bytes
        self.limits = {"/v1/audio/voices": settings.max_upload_bytes,
                       DETECT_PATH: settings.max_detect_bytes}
        self.send_timeout_s = settings.send_timeout_s
        self.pool = Pool()
        self.connections: set[_Conn] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self, sock) -> None:
        self.server = await asyncio.start_server(self._connection, sock=sock,
                                                 limit=64 * 1024)

    async def drain(self, grace_s: float) -> None:
        """Stop accepting; let requests in progress finish for up to `grace_s`, closing each
        connection once it is idle; then close the rest (WebSocket tunnels excepted)."""
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + grace_s
        while True:
            http = [conn for conn in self.connections if not conn.tunnel]
            for conn in http:
                if not conn.busy:
                    conn.writer.transport.abort()
            if not any(conn.busy for conn in http) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if not conn.tunnel:
                conn.writer.transport.abort()

    def close(self) -> None:
        for conn in list(self.connections):
            conn.writer.transport.abort()
        self.pool.close()

    # ------------------------------------------------------------------ a client connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(reader, writer)
        self.connections.add(conn)
        asyncio.ensure_future(writer.wait_closed()).add_done_callback(conn.on_lost)
        loop = asyncio.get_running_loop()
        try:
            keep = True
            while keep and not conn.lost:
                idle = loop.call_later(CLIENT_IDLE_S, writer.transport.abort)
                try:
                    request = await read_request_head(reader)
                finally:
                    idle.cancel()
                if request is None:
                    break
                conn.busy = True
                try:
                    keep = await self._request(conn, request)
                except HttpError as error:  # answered by the relay; the body may be unread
                    writer.write(error_bytes(error))
                    keep = False
                    await _linger(reader, writer)
                finally:
                    conn.busy = False
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError):
            pass  # the client went away or sent garbage mid-message: nothing to answer
        except Exception:
            logger.exception("relay: unexpected error on a client connection")
        finally:
            self.connections.discard(conn)
            writer.close()

    async def _request(self, conn: _Conn, request: Request) -> bool:
        """Serve one request; True to keep the connection for the next."""
        path = request.path
        if request.upgrade and path == WS_PATH:
            return await self._tunnel(conn, request)  # the WebSocket relay checks its own key
        if self.api_key is not None and path.startswith("/v1/") and \
                not bearer_ok(request.header(b"authorization"), self.api_key):
            raise HttpError(401, _UNAUTHORIZED, code="invalid_api_key")
        limit = self.limits.get(path.rstrip("/"), self.json_limit_bytes)
        declared = declared_length(request)
        if declared is not None and declared > limit:
            raise too_large(limit)
        if (request.header(b"expect") or b"").lower() == b"100-continue":
            conn.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await read_body(conn.reader, request, limit)
        key_of = ROUTED.get(path) if request.method == b"POST" else None
        if key_of is None:
            return await self._to_control(conn, request, body)
        return await self._route(conn, request, body, key_of)

    # ------------------------------------------------------------------ speech: routed
    async def _route(self, conn: _Conn, request: Request, body: bytes,
                     key_of: Callable[[dict], str | None]) -> bool:
        frontend = self.frontend
        router = frontend.router
        key = body_key(body, key_of)
        head_bytes = upstream_request(request, body, drop=_TO_REPLICA_DROP)
        tried: list[str] = []
        passed_on: bytes | None = None  # the last 429/503 answer, given if no replica takes it
        failed = False  # a connection to a replica failed after it was made
        while True:
            decision = router.choose(key, exclude=tried)
            if decision is None:
                if passed_on is not None:
                    conn.writer.write(passed_on)
                    return request.keep_alive
                error = _replica_failed() if failed else _no_replica(frontend)
                conn.writer.write(error_bytes(error, request.keep_alive))
                return request.keep_alive
            replica = frontend.replicas[decision.replica]
            path = str(replica.socket_path)
            router.dispatched(replica.id)
            try:
                upstream, head, first = await self._exchange(path, head_bytes, body)
            except ReplicaUnreachable:
                router.finished(replica.id)
                frontend.mark_down(replica)
            except UpstreamFailed:
                router.finished(replica.id)
                failed = True
            else:
                if head.status in RETRYABLE_STATUS:
                    answer = await self._read_whole(upstream, head, first, path)
                    router.finished(replica.id)
                    passed_on = answer if answer is not None else passed_on
                else:
                    try:
                        return await self._respond(conn, request, upstream, head, first, path,
                                                   replica.id)
                    finally:
                        router.finished(replica.id)
            if conn.lost:
                return False
            tried.append(replica.id)
            router.count_retry()

    async def _exchange(self, path: str, head_bytes: bytes, body: bytes):
        """Send the request on a pooled connection (a fresh one if a reused one fails first);
        returns (connection, response head, the body bytes that came with the head)."""
        for attempt in (0, 1):
            try:
                upstream, reused = await self.pool.get(path)
            except OSError as error:
                raise ReplicaUnreachable(str(error)) from None
            try:
                head, first = await upstream.exchange(head_bytes, body)
                return upstream, head, first
            except (OSError, ConnectionError):
                upstream.abort()
                if not (reused and attempt == 0):  # a kept-alive connection the replica closed
                    raise UpstreamFailed() from None
        raise AssertionError("unreachable")

    async def _read_whole(self, upstream: Upstream, head: ResponseHead, first: bytes,
                          path: str) -> bytes | None:
        """A small answer (429/503) read whole, as the client would get it; None if cut."""
        sink = Collect()
        follower = BodyFollower(head, b"POST")
        if not follower.empty and not await upstream.forward(sink, follower, first, _no_drain, 30.0):
            return None
        self.pool.put(path, upstream)
        return client_head(head, keep_alive=True) + b"".join(sink.parts)

    # ------------------------------------------------------------------ the answer, passed on
    async def _respond(self, conn: _Conn, request: Request, upstream: Upstream,
                       head: ResponseHead, first: bytes, path: str, replica_id: str | None) -> bool:
        """Pass the upstream's answer on as it arrives; pool its connection when it ends whole.
        True to keep the client connection."""
        follower = BodyFollower(head, request.method)
        keep = request.keep_alive and not follower.until_close
        out = conn.writer
        out.write(client_head(head, keep))
        if (head.header(b"connection") or b"").lower() == b"close":
            upstream.reusable = False
        if follower.empty:
            self.pool.put(path, upstream)
            return keep
        conn.upstream = upstream
        try:
            whole = await upstream.forward(out.transport, follower, first, out.drain,
                                           self.send_timeout_s)
        except (OSError, ConnectionError, asyncio.TimeoutError):  # the client stalled or left
            out.transport.abort()
            upstream.abort()
            return False
        finally:
            conn.upstream = None
        if not whole:
            if not conn.lost:
                logger.warning("replica %s: its answer stopped after %d bytes (the replica closed "
                               "or died); the client's response is cut",
                               replica_id or "control plane", upstream.sent)
            out.transport.abort()
            return False
        if follower.until_close:
            return False
        self.pool.put(path, upstream)
        return keep

    # ------------------------------------------------------------------ the control plane
    async def _to_control(self, conn: _Conn, request: Request, body: bytes) -> bool:
        head_bytes = upstream_request(request, body)
        try:
            upstream, head, first = await self._exchange(self.control_socket, head_bytes, body)
        except (ReplicaUnreachable, UpstreamFailed):
            raise HttpError(503, "the front end is shutting down", code="shutting_down",
                            type="server_error") from None
        return await self._respond(conn, request, upstream, head, first, self.control_socket, None)

    async def _tunnel(self, conn: _Conn, request: Request) -> bool:
        """A WebSocket upgrade to the control plane's relay (cluster/ws_relay.py), then bytes both
        ways until either side closes."""
        lines = [b"%s %s HTTP/1.1" % (request.method, request.target), b"host: frontend"]
        lines += [b"%s: %s" % pair for pair in request.headers if pair[0] != b"host"]
        try:
            reader, writer = await asyncio.open_unix_connection(self.control_socket)
        except OSError:
            raise HttpError(503, "the front end is shutting down", code="shutting_down",
                            type="server_error") from None
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n")
        try:
            head = await read_response_head(reader)
        except (OSError, EOFError, ConnectionError, asyncio.LimitOverrunError):
            writer.transport.abort()
            return False
        if head.status != 101:  # refused before the upgrade: pass the answer on, then close
            await _pass_until_close(reader, conn.writer, head)
            writer.transport.abort()
            return False
        conn.tunnel = True
        conn.writer.write(head.raw_status_line + b"\r\n" +
                          b"".join(b"%s: %s\r\n" % pair for pair in head.headers) + b"\r\n")
        await _pipe_both(conn.reader, conn.writer, reader, writer)
        return False


async def _no_drain() -> None:
    pass


async def _pass_until_close(reader: asyncio.StreamReader, out: asyncio.StreamWriter,
                            head: ResponseHead) -> None:
    out.write(client_head(head, keep_alive=False))
    follower = BodyFollower(head, b"GET")
    while not follower.empty:
        data = await reader.read(READ_BYTES)
        if not data:
            return
        out.write(data)
        if follower.feed(data):
            return


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an answer sent before the body was read (401, 413): say we are done writing and
    discard what the client still sends for a moment, so it can read the answer instead of
    meeting a reset mid-upload (a lingering close, as nginx does)."""
    deadline = time.monotonic() + LINGER_S
    try:
        if writer.can_write_eof():
            writer.write_eof()
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(READ_BYTES), left):
                return
    except (OSError, asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError):
        return


async def _pipe_both(a_reader, a_writer, b_reader, b_writer) -> None:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(READ_BYTES)
            if not data:
                return
            writer.write(data)
            await writer.drain()

    tasks = [asyncio.ensure_future(pipe(a_reader, b_writer)),
             asyncio.ensure_future(pipe(b_reader, a_writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        b_writer.close()


def _replica_failed() -> HttpError:
    return HttpError(503, "the engine replica's connection failed before it answered; retry",
                     code="replica_failed", type="server_error",
                     headers={"Retry-After": str(RETRY_AFTER_S)})


def _no_replica(frontend: Frontend) -> HttpError:
    error = no_replica(frontend)  # the control plane's words: one place
    return HttpError(error.status, error.message, code=error.code, type=error.type,
                     headers=error.headers)
