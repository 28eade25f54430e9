"""A WebSocket upgrade through the relay: to the control plane's WebSocket relay (ws_relay.py),
then bytes both ways until either side closes.

The relay answers the upgrade's malformed cases itself (listener.py); the key is checked where
the session is answered, by the control plane's ApiKeyMiddleware (server/auth.py, the same
policy as the relay's), so a refused session ends as on one server: an `error` event and close
1008.
"""

from __future__ import annotations

import asyncio

from higgs_serve.cluster.relay.connections import TUNNEL, Conn
from higgs_serve.cluster.relay.requests import Request
from higgs_serve.cluster.relay.responses import ResponseBody, ResponseHead, read_head
from higgs_serve.cluster.relay.wire import HttpError

READ_BYTES = 256 * 1024
UPGRADE_ANSWER_S = 10.0  # the control plane answers an upgrade at once


async def tunnel(conn: Conn, request: Request, control_socket: str) -> None:
    """Serve the upgrade `request` on `conn` (module note); the connection ends with it."""
    try:
        reader, writer = await asyncio.open_unix_connection(control_socket)
    except OSError:
        raise HttpError(503, "the front end is shutting down", code="shutting_down",
                        type="server_error") from None
    try:
        writer.write(request.upgrade_head() + conn.requests.rest)
        try:
            head = await asyncio.wait_for(read_head(reader), UPGRADE_ANSWER_S)
        except (OSError, EOFError, ConnectionError, asyncio.LimitOverrunError,
                asyncio.TimeoutError, TimeoutError):
            return
        if head.status != 101:  # refused before the upgrade: pass the answer on, then close
            await _pass_until_close(reader, conn.writer, head)
            return
        conn.enter(TUNNEL)
        conn.writer.write(head.switching())
        await _pipe_both(conn.reader, conn.writer, reader, writer)
    finally:
        writer.transport.abort()


async def _pass_until_close(reader: asyncio.StreamReader, out: asyncio.StreamWriter,
                            head: ResponseHead) -> None:
    out.write(head.for_client(keep_alive=False))
    follower = ResponseBody(head, b"GET")
    while not follower.empty:
        data = await reader.read(READ_BYTES)
        if not data:
            return
        out.write(data)
        if follower.feed(data):
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
