"""The front end's relays against two small upstream servers (stand-ins for replicas): WebSocket
frames both ways unchanged, one replica per session chosen by the session's voice, closes passed
on in both directions; a batch retried on the other replica when its home answers 503, and 429
or 503 from the front end itself when no replica can take it. Real uvicorn servers on loopback
and the real `websockets` client. (The real replicas: test_frontend_e2e_streaming.py.)"""

from __future__ import annotations

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
from higgs_serve.cluster.routing import Router, affinity_rank


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

    @app.post("/v1/audio/speech/batch")
    async def batch():  # replica A is shutting down: retryable before the first byte
        if name == "A":
            return JSONResponse({"error": {"message": "shutting down", "code": "shutting_down"}},
                                status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"object": "speech.batch", "replica": name}, headers={"X-Up": name})

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
        # the single server's other form of the key: past the check, then no replica is ready
        with client.websocket_connect("/v1/audio/speech/stream?api_key=sekret") as ws:
            ws.send_text(json.dumps({"type": "session.config"}))
            assert json.loads(ws.receive_text())["error"]["code"] == "queue_full"
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_text()
        assert closed.value.code == 1013


def test_a_batch_is_retried_on_another_replica_before_its_first_byte(relay):
    import httpx

    url, frontend, _ = relay
    http_url = url.replace("ws://", "http://").removesuffix("/v1/audio/speech/stream")
    voice = next(f"v{i}" for i in range(100)  # a voice whose home is A, which answers 503
                 if affinity_rank(f"voice:v{i}", "A") > affinity_rank(f"voice:v{i}", "B"))
    retries = frontend.router.stats.retries
    answer = httpx.post(f"{http_url}/v1/audio/speech/batch",
                        json={"voice": voice, "items": [{"input": "x"}]})
    assert answer.status_code == 200 and answer.json() == {"object": "speech.batch", "replica": "B"}
    assert answer.headers["x-up"] == "B"  # the replica's headers, passed on
    assert frontend.router.stats.retries == retries + 1


def test_a_batch_gets_429_when_every_replica_is_full_and_503_before_any_is_ready(tmp_path):
    from fastapi.testclient import TestClient

    replicas = {"A": Replica(id="A", url="http://127.0.0.1:9")}  # never reached
    router = Router({"A": 1})
    frontend = Frontend(replicas, router, tmp_path / "voices", 24000, FrontendSettings())
    body = {"items": [{"input": "x"}]}
    # no lifespan, so no supervisor: the replica's state is what the test sets
    client = TestClient(build_frontend(frontend))
    unready = client.post("/v1/audio/speech/batch", json=body)
    assert unready.status_code == 503 and unready.json()["error"]["code"] == "not_ready"
    replicas["A"].ready = True  # ready, and at its capacity
    router.set_healthy("A", True)
    router.dispatched("A")
    full = client.post("/v1/audio/speech/batch", json=body)
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
    assert full.headers["retry-after"]
