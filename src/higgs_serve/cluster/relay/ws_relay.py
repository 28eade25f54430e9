"""WebSocket `/v1/audio/speech/stream` through the front end: one replica per session.

Served by the control plane (the relay tunnels the upgrade here: tunnel.py). It does not interpret
the session protocol. The key is checked before it, by the control plane's ApiKeyMiddleware
(server/auth.py: an `error` event and close 1008, as on one server). It waits for the client's first frame (the session's configuration) for at most
ws_idle_timeout_s (then an `idle_timeout` error and a normal close, as the single server closes an
idle session), takes its voice as the affinity key when it is JSON that names one, opens the same
path on the chosen replica's socket, and from then on copies frames both ways unchanged (text
stays text, binary stays binary) until either side closes; the close is passed on. Once the
session runs, the replica's own idle timeout applies. A replica that dies mid-session (its
connection drops without a close frame) gives the client an `error` event (`replica_lost`: open a
new session to retry) and close code 1012 (service restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from higgs_serve.audio.provenance import CLAIM_HEADER
from higgs_serve.cluster.routing import routing_key
from higgs_serve.server.limits.json_limits import JsonShapeError, check_json_shape

logger = logging.getLogger(__name__)
PATH = "/v1/audio/speech/stream"
CLOSE_NORMAL = 1000
CLOSE_INTERNAL = 1011
CLOSE_RESTART = 1012  # the replica went away: try again
CLOSE_TRY_AGAIN = 1013  # no capacity now
_UNSENDABLE = frozenset({1005, 1006, 1015})  # codes that describe a close, never sent in one


def session_key(first_frame: str | bytes) -> str | None:
    """The affinity key of a session from its first frame: a `voice` (or reference) at the top
    level or one level down (e.g. {"type": "session.config", "session": {"voice": ...}}).

    The frame's shape is measured before it is parsed, as the single server measures every
    message (server/limits/json_limits.py): a frame too costly to parse would hold the front end's event
    loop for every session and request it relays. Such a frame, or one that is not JSON, has no
    key; it is passed on, and the replica answers it as the single server does (`invalid_json` or
    `message_too_large`, the session still open for a valid config)."""
    try:
        check_json_shape(first_frame)
        message = json.loads(first_frame)
    except (JsonShapeError, ValueError, TypeError, RecursionError):  # not JSON, or too costly
        return None
    if not isinstance(message, dict):
        return None
    for part in (message, *[v for v in message.values() if isinstance(v, dict)]):
        key = routing_key(part)
        if key is not None:
            return key
    return None


def error_event(message: str, code: str, type: str = "invalid_request_error") -> str:
    """The single server's `error` event (server/websocket/session.py)."""
    error = {"message": message, "type": type, "param": None, "code": code}
    return json.dumps({"type": "error", "message": message, "code": code, "error": error})


def add_websocket(app: FastAPI, frontend) -> None:
    @app.websocket(PATH)
    async def relay(client: WebSocket) -> None:
        claim = frontend.settings.c2pa_claim
        await client.accept(headers=[(CLAIM_HEADER.lower().encode(), claim.encode())] if claim else None)
        try:
            first = await asyncio.wait_for(_receive(client), frontend.settings.ws_idle_timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            await _end(client, error_event("the session was idle too long and is closed",
                                           "idle_timeout"), CLOSE_NORMAL)
            return
        except WebSocketDisconnect:
            return
        if first is None:
            return
        await _session(frontend, client, first)


async def _receive(client: WebSocket) -> str | bytes | None:
    message = await client.receive()
    if message["type"] == "websocket.disconnect":
        return None
    return message["text"] if message.get("text") is not None else message["bytes"]


async def _end(client: WebSocket, event: str | None, code: int, reason: str = "") -> None:
    with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
        if event is not None:
            await client.send_text(event)
        await client.close(code=code, reason=reason)


async def _session(frontend, client: WebSocket, first: str | bytes) -> None:
    key = session_key(first)
    tried: list[str] = []
    while True:
        decision = frontend.router.choose(key, exclude=tried)
        if decision is None:
            await _end(client, error_event("every engine replica is at capacity or not ready; "
                                           "retry later", "queue_full", "overloaded_error"),
                       CLOSE_TRY_AGAIN)
            return
        replica = frontend.replicas[decision.replica]
        try:
            upstream = await unix_connect(str(replica.socket_path), f"ws://replica{PATH}",
                                          max_size=None, open_timeout=5)
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as error:
            status = error.response.status_code if isinstance(error, InvalidStatus) else None
            if not frontend.router.may_retry(first_byte_sent=False, status=status):
                await _end(client, None, CLOSE_INTERNAL, "the replica refused the session")
                return
            if isinstance(error, OSError):
                frontend.mark_down(replica)
            tried.append(replica.id)
            frontend.router.count_retry()
            continue
        break
    frontend.router.dispatched(replica.id)
    try:
        async with upstream:
            with contextlib.suppress(ConnectionClosed):
                await upstream.send(first)
            await _pump(client, upstream, replica.id)
    finally:
        frontend.router.finished(replica.id)


async def _pump(client: WebSocket, upstream, replica_id: str) -> None:
    """Copy frames both ways until one side closes, then close the other."""
    async def client_to_upstream() -> None:
        while True:
            message = await _receive(client)
            if message is None:
                return
            await upstream.send(message)

    async def upstream_to_client() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in upstream:
                if isinstance(message, bytes):
                    await client.send_bytes(message)
                else:
                    await client.send_text(message)

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if tasks[0] in done and tasks[0].exception() is None:
        await upstream.close()  # the client left: the replica aborts the session's work
        return
    received = upstream.protocol.close_rcvd
    if received is None:  # the connection dropped without a close frame: the replica died
        logger.warning("replica %s: lost during a WebSocket session; the client is told to retry",
                       replica_id)
        await _end(client, error_event(f"the engine replica serving this session ({replica_id}) "
                                       "stopped; open a new session to retry",
                                       "replica_lost", "server_error"), CLOSE_RESTART,
                   "replica lost")
        return
    code = CLOSE_NORMAL if received.code in _UNSENDABLE else received.code  # 1005: none given
    await _end(client, None, code, received.reason)  # the replica's close, passed on
