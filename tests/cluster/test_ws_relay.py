"""The front end's relays against two small upstream servers (stand-ins for replicas, on Unix
sockets as the real ones are): WebSocket frames both ways unchanged, one replica per session
chosen by the session's voice, closes passed on in both directions, a session that never
configures closed after the idle timeout; a batch retried on the other replica when its home
answers 503, and 429 or 503 from the front end itself when no replica can take it; the API key
checked as the single server checks it; on a signing front end (--c2pa-cert) the upgrade carries
the C2PA claim header, as a replica's does. The real front end (relay + control plane) in a thread,
real uvicorn upstreams and the real `websockets` client. (The real replicas:
test_frontend_e2e_streaming.py.)"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.frontend_thread import frontend_thread, serve_app_on_socket, stand_in_app, wait_until

from higgs_serve import __version__
from higgs_serve.audio.provenance import CLAIM_HEADER, claim_json
from higgs_serve.cluster.frontend import Frontend, FrontendSettings
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router, affinity_rank
from higgs_serve.server.settings import ServerSettings

CLAIM = claim_json(__version__)


def _upstream(name: str, events: list) -> FastAPI:
    app = stand_in_app()

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


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    events: list = []
    work = tmp_path_factory.mktemp("relay")
    upstreams = [serve_app_on_socket(_upstream(name, events), work / f"{name}.sock")
                 for name in ("A", "B")]
    replicas = {name: Replica(id=name, socket_path=work / f"{name}.sock") for name in "AB"}
    router = Router({name: 8 for name in replicas}, rng=random.Random(0))
    frontend = Frontend(replicas, router, work / "voices", 24000,
                        FrontendSettings(ws_idle_timeout_s=1.0, c2pa_claim=CLAIM), poll_interval_s=0.05)
    with frontend_thread(frontend, work) as url:
        wait_until(lambda: len(frontend.ready_replicas()) == 2, what="both upstreams ready")
        yield url.replace("http://", "ws://") + "/v1/audio/speech/stream", frontend, events
    for server, thread in upstreams:
        server.should_exit = True
        thread.join(timeout=10)


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
        assert ws.response.headers[CLAIM_HEADER] == CLAIM
        ws.send("hello")
        assert ws.recv(timeout=5) == "HELLO"
        ws.send(b"\x00\x01\x02")
        assert ws.recv(timeout=5) == b"\x02\x01\x00"  # binary stays binary


def test_a_signing_front_end_states_the_claim_and_others_do_not():
    signing = ServerSettings(c2pa_cert="chain.pem", c2pa_key="key.pem")  # read by the replicas
    assert FrontendSettings.of(signing).c2pa_claim == CLAIM
    assert FrontendSettings.of(ServerSettings()).c2pa_claim is None


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


def test_a_session_that_never_configures_is_closed_after_the_idle_timeout(relay):
    url, _, _ = relay
    started = time.monotonic()
    with connect(url) as ws:
        event = json.loads(ws.recv(timeout=10))  # nothing sent: the front end's idle timeout (1 s)
        assert event["type"] == "error" and event["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1000 and time.monotonic() - started < 5


def _lonely_frontend(tmp_path, **settings) -> Frontend:
    """A front end whose one replica's socket does not exist (never reached) and whose
    supervisor checks once at start, then leaves the replica's state to the test."""
    replicas = {"A": Replica(id="A", socket_path=tmp_path / "absent.sock")}
    return Frontend(replicas, Router({"A": 1}), tmp_path / "voices", 24000,
                    FrontendSettings(**settings), poll_interval_s=1000)


def test_the_api_key_guards_the_front_end(tmp_path):
    with frontend_thread(_lonely_frontend(tmp_path, api_key="sekret"), tmp_path) as url:
        client = httpx.Client(base_url=url, timeout=10)
        assert client.get("/v1/audio/voices").status_code == 401
        denied = client.post("/v1/audio/speech", json={"input": "x"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        # a token that is not ASCII: 401 as on the single server, never a 500
        odd = client.post("/v1/audio/speech", json={"input": "x"},
                          headers={b"Authorization": "Bearer sekrét".encode()})
        assert odd.status_code == 401 and odd.json()["error"]["code"] == "invalid_api_key"
        ok = client.get("/v1/audio/voices", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["data"] == []
        assert client.get("/health").status_code == 200  # open, like the single server
        unready = client.post("/v1/audio/speech", json={"input": "x"},
                              headers={"Authorization": "Bearer sekret"})
        assert unready.status_code == 503 and unready.json()["error"]["code"] == "not_ready"
        ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        with connect(ws_url) as ws:  # the single server's answer: an error event, then 1008
            assert json.loads(ws.recv(timeout=5))["code"] == "invalid_api_key"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
        assert closed.value.rcvd.code == 1008
        # the single server's other form of the key: past the check, then no replica is ready
        with connect(ws_url + "?api_key=sekret") as ws:
            ws.send(json.dumps({"type": "session.config"}))
            assert json.loads(ws.recv(timeout=5))["error"]["code"] == "queue_full"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
        assert closed.value.rcvd.code == 1013


def test_a_batch_is_retried_on_another_replica_before_its_first_byte(relay):
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
    frontend = _lonely_frontend(tmp_path)
    body = {"items": [{"input": "x"}]}
    with frontend_thread(frontend, tmp_path) as url:
        client = httpx.Client(base_url=url, timeout=10)
        unready = client.post("/v1/audio/speech/batch", json=body)
        assert unready.status_code == 503 and unready.json()["error"]["code"] == "not_ready"
        replica, router = frontend.replicas["A"], frontend.router
        replica.ready = True  # ready, and at its capacity
        router.set_healthy("A", True)
        router.dispatched("A")
        full = client.post("/v1/audio/speech/batch", json=body)
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        assert full.headers["retry-after"]
