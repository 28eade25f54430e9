"""WebSocket `/v1/audio/speech/stream` through the front end: one replica per session.

The relay does not interpret the session protocol. It reads the client's first frame (the
session's configuration), takes its voice as the affinity key when it is JSON that names one,
opens the same path on the chosen replica, and from then on copies frames both ways unchanged
(text stays text, binary stays binary) until either side closes; the close is passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from higgs_serve.cluster.routing import routing_key

logger = logging.getLogger(__name__)
PATH = "/v1/audio/speech/stream"
_TRY_AGAIN_LATER = 1013  # WebSocket close code: no capacity now


def session_key(first_frame: str | bytes) -> str | None:
    """The affinity key of a session from its first frame: a `voice` (or reference) at the top
    level or one level down (e.g. {"type": "session.config", "session": {"voice": ...}})."""
    try:
        message = json.loads(first_frame)
    except (ValueError, TypeError):
        return None
    if not isinstance(message, dict):
        return None
    for part in (message, *[v for v in message.values() if isinstance(v, dict)]):
        key = routing_key(part)
        if key is not None:
            return key
    return None


def add_websocket(app: FastAPI, frontend) -> None:
    @app.websocket(PATH)
    async def relay(client: WebSocket) -> None:
        if not _authorized(client, frontend.settings.api_key):
            await client.close(code=1008, reason="missing or invalid API key")
            return
        await client.accept()
        try:
            first = await _receive(client)
        except WebSocketDisconnect:
            return
        if first is None:
            return
        await _session(frontend, client, first)


def _authorized(client: WebSocket, api_key: str | None) -> bool:
    """The single server's rule: `Authorization: Bearer KEY` or the `api_key` query parameter
    (browsers cannot set headers on a WebSocket)."""
    if api_key is None:
        return True
    expected = api_key.encode()
    scheme, _, token = client.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode("latin-1"),
                                                             expected):
        return True
    query = client.query_params.get("api_key", "")
    return bool(query) and secrets.compare_digest(query.encode(), expected)


async def _receive(client: WebSocket) -> str | bytes | None:
    message = await client.receive()
    if message["type"] == "websocket.disconnect":
        return None
    return message["text"] if message.get("text") is not None else message["bytes"]


async def _session(frontend, client: WebSocket, first: str | bytes) -> None:
    key = session_key(first)
    tried: list[str] = []
    while True:
        decision = frontend.router.choose(key, exclude=tried)
        if decision is None:
            await _refuse(client)
            return
        replica = frontend.replicas[decision.replica]
        url = replica.url.replace("http://", "ws://", 1) + PATH
        try:
            upstream = await connect(url, max_size=None, open_timeout=5)
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as error:
            status = error.response.status_code if isinstance(error, InvalidStatus) else None
            if not frontend.router.may_retry(first_byte_sent=False, status=status):
                await client.close(code=1011, reason="the replica refused the session")
                return
            tried.append(replica.id)
            frontend.router.count_retry()
            continue
        break
    frontend.router.dispatched(replica.id)
    try:
        async with upstream:
            await upstream.send(first)
            await _pump(client, upstream)
    finally:
        frontend.router.finished(replica.id)


async def _refuse(client: WebSocket) -> None:
    error = {"type": "error", "error": {"message": "every engine replica is at capacity or not "
                                                   "ready; retry later",
                                        "type": "overloaded_error", "param": None,
                                        "code": "queue_full"}}
    await client.send_text(json.dumps(error))
    await client.close(code=_TRY_AGAIN_LATER)


async def _pump(client: WebSocket, upstream) -> None:
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
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if tasks[1] in done:  # the replica ended the session: pass its close on
        code = upstream.close_code or 1000
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await client.close(code=code if code != 1005 else 1000, reason=upstream.close_reason or "")
    else:  # the client left: close upstream (the replica aborts the session's work)
        await upstream.close()
