"""The front end's WebSocket relay against two small upstream WebSocket servers (stand-ins for
replicas that speak `/v1/audio/speech/stream`): frames both ways unchanged, one replica per
session chosen by the session's voice, closes passed on in both directions. Real uvicorn
servers on loopback and the real `websockets` client."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, PlainTextResponse
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from higgs_serve.cluster.frontend import Frontend, FrontendSettings, build_frontend
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router


def _upstream(name: str, events: list) -> FastAPI:
    app = FastAPI()

    @app.get("/ready")
    async def ready():
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse("")

    @app.get("/v1/audio/voices")
    async def voices():
        return JSONResponse({"object": "list", "data": []})

    @app.websocket("/v1/audio/speech/stream")
    async def stream(ws: WebSocket):
        await ws.accept()
        try:
            config = json.loads(await ws.receive_text())
            await ws.send_text(json.dumps({"type": "session.created", "replica": name,
                                           "voice": config["session"]["voice"]}))
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect()
                if message.get("bytes") is not None:
                    await ws.send_bytes(message["bytes"][::-1])
                elif message["text"] == "bye":
                    await ws.close(code=4000, reason="done")
                    return
                else:
                    await ws.send_text(message["text"].upper())
        except WebSocketDisconnect:
            events.append((name, "client left"))

    return app


def _serve(app: FastAPI):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    events: list = []
    upstreams = [_serve(_upstream(name, events)) for name in ("A", "B")]
    replicas = {name: Replica(id=name, url=url) for name, (_, _, url) in zip("AB", upstreams)}
    router = Router({name: 8 for name in replicas}, rng=random.Random(0))
    frontend = Frontend(replicas, router, tmp_path_factory.mktemp("voices"), 24000,
                        FrontendSettings(), poll_interval_s=0.05)
    server, thread, url = _serve(build_frontend(frontend))
    deadline = time.monotonic() + 10
    while len(frontend.ready_replicas()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield url.replace("http://", "ws://") + "/v1/audio/speech/stream", frontend, events
    for srv, th, _ in (*upstreams, (server, thread, url)):
        srv.should_exit = True
        th.join(timeout=10)


def _open(url: str, voice: str):
    ws = connect(url)
    ws.send(json.dumps({"type": "session.config", "session": {"voice": voice}}))
    created = json.loads(ws.recv(timeout=5))
    assert created["type"] == "session.created" and created["voice"] == voice
    return ws, created["replica"]


def test_frames_pass_both_ways_unchanged(relay):
    url, _, _ = relay
    ws, _ = _open(url, "alice")
    with ws:
        ws.send("hello")
        assert ws.recv(timeout=5) == "HELLO"
        ws.send(b"\x00\x01\x02")
        assert ws.recv(timeout=5) == b"\x02\x01\x00"  # binary stays binary


def test_a_voice_pins_its_sessions_to_one_replica(relay):
    url, frontend, _ = relay
    homes = set()
    for _ in range(4):
        ws, replica = _open(url, "bob")
        ws.close()
        homes.add(replica)
    assert len(homes) == 1
    assert frontend.router.homes["voice:bob"] == list(homes)


def test_closes_are_passed_on_both_ways(relay):
    url, frontend, events = relay
    ws, replica = _open(url, "carol")
    ws.send("bye")  # the replica ends the session: the client sees its code
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd.code == 4000 and closed.value.rcvd.reason == "done"
    ws, replica = _open(url, "dave")
    ws.close()  # the client leaves: the replica's session ends too
    deadline = time.monotonic() + 5
    while (replica, "client left") not in events:
        assert time.monotonic() < deadline, events
        time.sleep(0.02)
    while any(state.in_flight for state in frontend.router.replicas.values()):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_the_api_key_guards_the_front_end(tmp_path):
    from fastapi.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    replicas = {"A": Replica(id="A", url="http://127.0.0.1:9")}  # never reached
    frontend = Frontend(replicas, Router({"A": 1}), tmp_path / "voices", 24000,
                        FrontendSettings(api_key="sekret"))
    with TestClient(build_frontend(frontend)) as client:
        assert client.get("/v1/audio/voices").status_code == 401
        denied = client.post("/v1/audio/speech", json={"input": "x"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        ok = client.get("/v1/audio/voices", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["data"] == []
        assert client.get("/health").status_code == 200  # open, like the single server
        unready = client.post("/v1/audio/speech", json={"input": "x"},
                              headers={"Authorization": "Bearer sekret"})
        assert unready.status_code == 503 and unready.json()["error"]["code"] == "not_ready"
        with pytest.raises(WebSocketDisconnect) as closed:
            with client.websocket_connect("/v1/audio/speech/stream") as ws:
                ws.receive_text()
        assert closed.value.code == 1008
