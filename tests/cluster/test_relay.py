"""The front end's data plane (cluster/relay/listener.py) as an attacker and a failing replica would try
it: the single server's body limits answered before any body byte is read (413), deeply nested
JSON relayed (the replica's 400, never a 5xx of the front end's own), a replica that answers
early and resets the connection while the body is sent is not taken out of rotation, and a
replica that dies in a WebSocket session gives the client an `error` event and close 1012.
Real front end in a thread, stand-in replicas on Unix sockets (uvicorn, raw asyncio servers, the
`websockets` server), raw sockets and real clients."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from http import HTTPStatus
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from websockets.asyncio.server import unix_serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.frontend_thread import front_end_over, frontend_thread, stand_in_app, wait_until

from higgs_serve.cluster.frontend import Frontend, FrontendSettings
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router

LIMIT = 4096


def _replica_app(received: list[int]) -> FastAPI:
    app = stand_in_app()

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        body = await request.body()
        received.append(len(body))
        try:
            json.loads(body)
        except (ValueError, RecursionError):
            return JSONResponse({"error": {"message": "request body is not valid JSON"}}, 400)

        async def chunks():
            for _ in range(3):
                yield b"\x00" * 960
        return StreamingResponse(chunks(), media_type="audio/pcm")

    return app


@pytest.fixture(scope="module")
def one_replica(tmp_path_factory):
    received: list[int] = []
    with front_end_over(_replica_app(received), tmp_path_factory.mktemp("relay1"),
                        max_json_body_bytes=LIMIT, max_upload_bytes=2 * LIMIT,
                        max_detect_bytes=3 * LIMIT) as (url, frontend):
        yield url, frontend, received


def _raw(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send `head` (and `body`) on a raw socket; the whole answer until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_declared_oversized_body_is_refused_before_it_is_read(one_replica):
    url, _, received = one_replica
    before = len(received)
    # the head alone, declaring 100 MB: the answer comes without a byte of the body sent
    answer = _raw(url, b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                       b"\r\ncontent-length: 100000000\r\n\r\n")
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413")
    error = json.loads(body)["error"]
    assert error["code"] == "body_too_large" and error["type"] == "invalid_request_error"
    assert len(received) == before  # the replica never saw it
    # the upload route has its own (larger) limit, as on the single server
    upload = _raw(url, b"POST /v1/audio/voices HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
                  % (2 * LIMIT + 1))
    assert upload.startswith(b"HTTP/1.1 413")


def test_watermark_detection_has_its_own_body_limit_and_reaches_the_control_plane(one_replica):
    """A detection upload larger than a JSON body is let through to the control plane (which
    answers it: junk is its 400), one past its own limit is a 413 before it is read."""
    url, _, _ = one_replica
    path = b"/v1/audio/watermark/detect"
    over = _raw(url, b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (path, 3 * LIMIT + 1))
    assert over.startswith(b"HTTP/1.1 413")
    junk = httpx.post(f"{url}{path.decode()}", files={"file": ("clip", b"x" * (2 * LIMIT))}, timeout=30)
    assert junk.status_code == 400 and junk.json()["error"]["param"] == "file", junk.text


def test_a_chunked_body_is_counted_while_it_arrives(one_replica):
    url, _, received = one_replica
    before = len(received)
    chunks = b"".join(b"%x\r\n%s\r\n" % (1000, b"a" * 1000) for _ in range(5))  # 5000 > LIMIT
    answer = _raw(url, b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked"
                       b"\r\n\r\n", chunks)
    assert answer.startswith(b"HTTP/1.1 413") and len(received) == before
    # an oversized body sent whole by an ordinary client: it reads the 413, not a reset
    sent = httpx.post(f"{url}/v1/audio/speech", content=b"x" * (50 * LIMIT))
    assert sent.status_code == 413 and sent.json()["error"]["code"] == "body_too_large"


def test_deeply_nested_json_is_the_replicas_400_not_a_500(one_replica):
    url, frontend, _ = one_replica
    nested = httpx.post(f"{url}/v1/audio/speech", content=b"[" * 4000)
    assert nested.status_code == 400
    speech = httpx.post(f"{url}/v1/audio/speech", json={"input": "x"})
    assert speech.status_code == 200 and speech.content == b"\x00" * 2880  # relayed whole
    assert frontend.ready_replicas()


async def _early_answer_then_reset(writer: asyncio.StreamWriter):
    """A replica that answers 413 as soon as it has the head and resets the connection."""
    body = b'{"error": {"message": "too large", "code": "body_too_large"}}'
    writer.write(b"HTTP/1.1 413 Content Too Large\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.transport.abort()


async def _reset_at_once(writer: asyncio.StreamWriter):
    writer.transport.abort()


class _RawReplica:
    """A raw asyncio server on a Unix socket for /v1 speech, uvicorn's stand-in app elsewhere:
    it handles `/ready` and `/metrics` (so the supervisor keeps it ready) itself."""

    def __init__(self, path: Path, speech_handler):
        self.path, self.speech_handler = path, speech_handler
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET"):  # /ready, /metrics, the (empty) voice list
                body = b'{"object": "list", "data": []}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (len(body), body))
                writer.close()
                return
            await self.speech_handler(writer)  # with the body unread

        async def main():
            self.server = await asyncio.start_unix_server(handle, str(path))
            started.set()
            await asyncio.Event().wait()

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self.thread.start()
        assert started.wait(5)


@pytest.mark.parametrize("handler", [_early_answer_then_reset, _reset_at_once])
def test_a_reset_while_the_body_is_sent_never_marks_the_replica_down(tmp_path, handler):
    _RawReplica(tmp_path / "A.sock", handler)
    replicas = {"A": Replica(id="A", socket_path=tmp_path / "A.sock")}
    frontend = Frontend(replicas, Router({"A": 8}), tmp_path / "voices", 24000,
                        FrontendSettings(), poll_interval_s=0.05)
    with frontend_thread(frontend, tmp_path) as url:
        wait_until(lambda: frontend.ready_replicas(), what="the replica ready")
        marked = []
        frontend.supervisor.mark_down = lambda replica: marked.append(replica.id)
        body = b'{"input": "' + b"x" * 900_000 + b'"}'  # under the limit, too big for a socket buffer
        answers = [httpx.post(f"{url}/v1/audio/speech", content=body, timeout=20) for _ in range(3)]
        if handler is _early_answer_then_reset:  # the replica's early answer reaches the client
            assert {a.status_code for a in answers} <= {413, 503}
            assert 413 in {a.status_code for a in answers}
        else:
            assert {a.status_code for a in answers} == {503}
            assert answers[0].json()["error"]["code"] == "replica_failed"
        assert marked == [] and frontend.ready_replicas() == [replicas["A"]]


def _answer_polls(connection, request):
    """The stand-in answers the supervisor's plain HTTP requests as a replica would (ready, no
    load, no voices), so it is in rotation by the front end's own checks; upgrades go on to the
    session."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return None
    return connection.respond(HTTPStatus.OK, '{"status": "ready", "object": "list", "data": []}')


async def _dies_mid_session(ws):
    await ws.recv()  # the session's configuration
    await ws.send(json.dumps({"type": "session.created"}))
    await ws.recv()
    ws.transport.abort()  # the process died: no close frame


def test_a_replica_dying_mid_session_gives_an_error_event_and_1012(tmp_path):
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def main():
        async with unix_serve(_dies_mid_session, str(tmp_path / "ws.sock"),
                              process_request=_answer_polls):
            started.set()
            await asyncio.Event().wait()

    threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True).start()
    assert started.wait(5)
    replicas = {"W": Replica(id="W", socket_path=tmp_path / "ws.sock")}
    frontend = Frontend(replicas, Router({"W": 8}, rng=random.Random(0)), tmp_path / "voices",
                        24000, FrontendSettings(), poll_interval_s=0.05)
    with frontend_thread(frontend, tmp_path) as url:
        wait_until(lambda: frontend.ready_replicas(), what="the stand-in ready")
        with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
            ws.send(json.dumps({"type": "session.config", "voice": "x" * 10}))
            assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
            ws.send(json.dumps({"type": "input.text", "text": "Hello."}))
            event = json.loads(ws.recv(timeout=5))
            assert event["type"] == "error" and event["code"] == "replica_lost"
            assert event["error"]["type"] == "server_error" and "retry" in event["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
        assert closed.value.rcvd.code == 1012
        wait_until(lambda: frontend.router.replicas["W"].in_flight == 0, what="the session's end")
