"""The front end's data plane: the public HTTP/1.1 listener, relaying speech to the replicas.

Why not Starlette + httpx (the front end until issue 44): at c = 64 half its CPU went to httpcore
rescanning its pool on every request start and end, and the relay cost as much CPU as the replica
spent serving the stream. Measured side by side on eight fake replicas (benchmarks/results,
relay_8_fakes.json; docs/api.md, "Several replicas behind one endpoint"), this relay spends a
fraction of that per audio-second and per request. Requests and answers are parsed by llhttp
(httptools, the parser uvicorn runs: requests.py, responses.py).

What it does, per request on a client connection (keep-alive, one request at a time):
- checks, before reading any body, and answers itself (then closes) when one fails: the HTTP
  version (1.0 or 1.1, else 505), the target (server/auth.py: its path normalized, an ambiguous
  one a 400), the transfer coding (chunked only, else 501; none on HTTP/1.0), the API key on
  every path but the public ones (server/auth.py, the single server's policy), and the single
  server's body limits (413 at once on a declared length over the limit; a chunked body is
  counted while it arrives). The head must come within CLIENT_IDLE_S, the body at
  MIN_BODY_BYTES_PER_S after BODY_GRACE_S (else 408);
- `POST /v1/audio/speech` and `/v1/audio/speech/batch`: reads the body, takes its affinity key
  (cluster/routing.py, the one policy), and sends it to the chosen replica over that replica's
  private Unix socket, on a pooled keep-alive connection. Before any byte came back it tries
  another replica on a replica it cannot reach (marked down), a connection that fails (not
  marked down: a reset while the body was sent says nothing about the replica's health), 429 or
  503. The answer passes through unchanged (status, headers, body framing; an HTTP/1.0 client
  gets the body unchunked, ended by the close), chunk by chunk, with backpressure; a client that
  leaves closes the upstream connection, which aborts the engine request;
- everything else (voices, watermark detection, health, metrics, models) goes unchanged to the
  control plane (cluster/control.py) on its private socket; a WebSocket upgrade of the
  streaming route becomes a byte tunnel to it (tunnel.py).
Connections are capped below the open-file limit (connections.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from higgs_serve.cluster.control import no_replica
from higgs_serve.cluster.relay.connections import IDLE, READING, SERVING, TUNNEL, Conn, \
    Connections, default_cap, too_many
from higgs_serve.cluster.relay.requests import Request
from higgs_serve.cluster.relay.responses import ResponseBody, ResponseHead
from higgs_serve.cluster.relay.tunnel import tunnel
from higgs_serve.cluster.relay.upstream import Collect, Pool, Upstream
from higgs_serve.cluster.relay.wire import HOP_HEADERS, HttpError, error_bytes, too_large
from higgs_serve.cluster.relay.ws_relay import PATH as WS_PATH
from higgs_serve.cluster.routing import RETRYABLE_STATUS, batch_routing_key, body_key, routing_key
from higgs_serve.server import auth
from higgs_serve.server.errors import RETRY_AFTER_S
from higgs_serve.server.limits.connections import LINGER_S
from higgs_serve.server.routers.watermark import DETECT_PATH

if TYPE_CHECKING:
    from higgs_serve.cluster.state import Frontend

logger = logging.getLogger(__name__)

ROUTED: Mapping[str, Callable[[dict], str | None]] = {
    "/v1/audio/speech": routing_key, "/v1/audio/speech/batch": batch_routing_key}
CLIENT_IDLE_S = 5.0  # a connection with no (whole) request head for this long is closed (uvicorn's)
BODY_GRACE_S = 10.0  # a body has this long, then must keep arriving at...
MIN_BODY_BYTES_PER_S = 64 * 1024  # ...this rate on average (else 408 and close)
READ_BYTES = 256 * 1024
# to a replica: not the client's key (replicas take none) nor its hop headers
_TO_REPLICA_DROP = HOP_HEADERS | {b"authorization"}


class ReplicaUnreachable(Exception):
    """No connection to the replica's socket: it is down."""


class UpstreamFailed(Exception):
    """The connection failed after it was made, before a response head came back."""


class Relay:
    """The data plane of one front end (module note). `start` it on a listening socket."""

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
        self.connections = Connections(settings.max_connections or default_cap())
        self.server: asyncio.AbstractServer | None = None

    async def start(self, sock) -> None:
        self.server = await asyncio.start_server(self._connection, sock=sock)

    async def drain(self, grace_s: float) -> None:
        """Stop accepting; let requests in progress finish for up to `grace_s`, closing each
        connection once it is idle; then close the rest (WebSocket tunnels excepted)."""
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + grace_s
        while True:
            http = [conn for conn in self.connections if conn.stage != TUNNEL]
            for conn in http:
                if not conn.busy:
                    conn.writer.transport.abort()
            if not any(conn.busy for conn in http) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in self.connections:
            if conn.stage != TUNNEL:
                conn.writer.transport.abort()

    def close(self) -> None:
        for conn in self.connections:
            conn.writer.transport.abort()
        self.pool.close()

    # ------------------------------------------------------------------ a client connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer)
        if not self.connections.admit(conn):
            conn.close_with(too_many())
            return
        asyncio.ensure_future(writer.wait_closed()).add_done_callback(conn.on_lost)
        loop = asyncio.get_running_loop()
        try:
            keep = True
            while keep and not conn.lost:
                conn.enter(IDLE)
                idle = loop.call_later(CLIENT_IDLE_S, _head_timeout, conn)
                try:
                    request = await conn.requests.head()
                finally:
                    idle.cancel()
                if request is None:
                    break
                conn.enter(READING)
                keep = await self._request(conn, request)
        except HttpError as error:  # answered by the relay; the body may be unread
            await _refuse(conn, error)
        except (OSError, ConnectionError):
            pass  # the client went away
        except Exception:
            logger.exception("relay: unexpected error on a client connection")
        finally:
            self.connections.discard(conn)
            writer.close()

    async def _request(self, conn: Conn, request: Request) -> bool:
        """Serve one request; True to keep the connection for the next."""
        _check_head(request)
        if request.upgrade:
            _check_upgrade(request)
            await tunnel(conn, request, self.control_socket)
            return False
        path = request.path
        if not auth.allowed(path, self.api_key, request.header(b"authorization")):
            raise HttpError(401, auth.UNAUTHORIZED, code="invalid_api_key")
        limit = self.limits.get(path.rstrip("/"), self.json_limit_bytes)
        declared = request.declared_length
        if declared is not None and declared > limit:
            raise too_large(limit)
        if request.version == "1.1" and not request.complete and \
                (request.header(b"expect") or b"").lower() == b"100-continue":
            conn.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await conn.requests.body(request, limit, BODY_GRACE_S, MIN_BODY_BYTES_PER_S)
        conn.enter(SERVING)
        key_of = ROUTED.get(path) if request.method == b"POST" else None
        if key_of is None:
            return await self._to_control(conn, request, body)
        return await self._route(conn, request, body, key_of)

    # ------------------------------------------------------------------ speech: routed
    async def _route(self, conn: Conn, request: Request, body: bytes,
                     key_of: Callable[[dict], str | None]) -> bool:
        frontend = self.frontend
        router = frontend.router
        key = body_key(body, key_of)
        head_bytes = request.upstream_head(body, drop=_TO_REPLICA_DROP)
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
                upstream, head, first = await self._exchange(path, head_bytes, body, request)
            except ReplicaUnreachable:
                router.finished(replica.id)
                frontend.mark_down(replica)
            except UpstreamFailed:
                router.finished(replica.id)
                failed = True
            else:
                if head.status in RETRYABLE_STATUS:
                    answer = await self._read_whole(upstream, head, first, path, request)
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

    async def _exchange(self, path: str, head_bytes: bytes, body: bytes, request: Request):
        """Send the request on a pooled connection (a fresh one if a reused one fails first);
        returns (connection, response head, the body bytes that came with the head)."""
        decode = request.version == "1.0"  # its client cannot read chunked framing
        for attempt in (0, 1):
            try:
                upstream, reused = await self.pool.get(path)
            except OSError as error:
                raise ReplicaUnreachable(str(error)) from None
            try:
                head, first = await upstream.exchange(head_bytes, body, decode)
                return upstream, head, first
            except (OSError, ConnectionError):
                upstream.abort()
                if not (reused and attempt == 0):  # a kept-alive connection the replica closed
                    raise UpstreamFailed() from None
        raise AssertionError("unreachable")

    async def _read_whole(self, upstream: Upstream, head: ResponseHead, first: bytes,
                          path: str, request: Request) -> bytes | None:
        """A small answer (429/503) read whole, as the client would get it; None if cut."""
        sink = Collect()
        follower = ResponseBody(head, b"POST", sink)
        if not follower.empty and not await upstream.forward(sink, follower, first, _no_drain, 30.0):
            return None
        self.pool.put(path, upstream)
        keep = request.keep_alive and not follower.decoded
        return head.for_client(keep, follower.decoded) + b"".join(sink.parts)

    # ------------------------------------------------------------------ the answer, passed on
    async def _respond(self, conn: Conn, request: Request, upstream: Upstream,
                       head: ResponseHead, first: bytes, path: str, replica_id: str | None) -> bool:
        """Pass the upstream's answer on as it arrives; pool its connection when it ends whole.
        True to keep the client connection."""
        out = conn.writer
        follower = ResponseBody(head, request.method, out.transport)
        keep = request.keep_alive and not follower.until_close and not follower.decoded
        out.write(head.for_client(keep, follower.decoded))
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
    async def _to_control(self, conn: Conn, request: Request, body: bytes) -> bool:
        head_bytes = request.upstream_head(body)
        try:
            upstream, head, first = await self._exchange(self.control_socket, head_bytes, body,
                                                         request)
        except (ReplicaUnreachable, UpstreamFailed):
            raise HttpError(503, "the front end is shutting down", code="shutting_down",
                            type="server_error") from None
        return await self._respond(conn, request, upstream, head, first, self.control_socket, None)


# ---------------------------------------------------------------------- checks of a head
def _check_head(request: Request) -> None:
    """The version, the target (its path normalized: server/auth.py) and the framing."""
    if request.error is not None:  # llhttp refused its framing once the head was in
        raise request.error
    if request.version not in ("1.1", "1.0"):
        raise HttpError(505, f"HTTP/{request.version} is not served; use HTTP/1.1",
                        code="http_version_not_supported")
    try:
        request.origin = auth.origin_form(request.target)
        request.path = auth.request_path(request.origin)
    except auth.BadTarget as error:
        raise HttpError(400, str(error), code="invalid_request_target") from None
    codings = request.values(b"transfer-encoding")
    if codings and request.version == "1.0":  # RFC 9112 6.1: faulty framing
        raise HttpError(400, "an HTTP/1.0 request cannot use Transfer-Encoding", code="bad_request")
    if codings and b",".join(codings).strip().lower() != b"chunked":
        raise HttpError(501, "only the chunked transfer coding is supported",
                        code="unsupported_transfer_coding")


def _check_upgrade(request: Request) -> None:
    if request.path != WS_PATH or request.method != b"GET" or \
            (request.header(b"upgrade") or b"").lower() != b"websocket":
        raise HttpError(400, f"the only upgrade served is a WebSocket GET of {WS_PATH}",
                        code="unsupported_upgrade")
    if request.declares_body:
        raise HttpError(400, "a WebSocket upgrade carries no body", code="bad_request")


def _head_timeout(conn: Conn) -> None:
    """No whole head within CLIENT_IDLE_S: an idle keep-alive connection just closes; one in the
    middle of sending a head is told why."""
    conn.close_with(HttpError(408, f"the request head did not arrive within {CLIENT_IDLE_S:.0f} s",
                              code="request_timeout") if conn.requests.in_message else None)


async def _refuse(conn: Conn, error: HttpError) -> None:
    """Answer `error` and close, after a lingering read (below)."""
    if conn.lost or conn.timed_out or conn.writer.transport.is_closing():
        return
    conn.writer.write(error_bytes(error))
    await _linger(conn.reader, conn.writer)


async def _no_drain() -> None:
    pass


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


def _replica_failed() -> HttpError:
    return HttpError(503, "the engine replica's connection failed before it answered; retry",
                     code="replica_failed", type="server_error",
                     headers={"Retry-After": str(RETRY_AFTER_S)})


def _no_replica(frontend: Frontend) -> HttpError:
    error = no_replica(frontend)  # the control plane's words: one place
    return HttpError(error.status, error.message, code=error.code, type=error.type,
                     headers=error.headers)
