"""Clients that hold resources (issue 28): readers that stop reading, oversized bodies, long
transcripts, the audio thread pool, and the shutdown's grace period.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from fake_engine import FakeEngine, fake_deploy
from hostile import GatedEncoder, tone_wav
from live_server import fake_settings, start_threaded_server


# ----------------------------------------------------------------------------- slow readers
def _stalled_stream(url: str, body: dict) -> socket.socket:
    """A raw client that sends a streaming request and then reads nothing (tiny receive buffer)."""
    host, port = url.removeprefix("http://").split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((host, int(port)))
    payload = json.dumps(body).encode()
    client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return client


def test_a_client_that_stops_reading_loses_its_slot_after_the_send_timeout(tmp_path):
    """Capacity 1 (one slot, no queue). A stalled reader takes the slot; after the send timeout
    its response is abandoned, its engine request aborted, and a second client is served."""
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=1, max_tokens=20000), chunk_frames=10)
    settings = fake_settings(tmp_path, max_queue=0, max_input_chars=10000, send_timeout_s=1.0)
    live = start_threaded_server(engine, settings)
    long_stream = {"input": "x" * 8000, "response_format": "pcm", "stream": True}  # 30 MB of pcm
    try:
        stalled = _stalled_stream(live.url, long_stream)
        with httpx.Client(base_url=live.url, timeout=30) as http:
            deadline = time.monotonic() + 5
            while live.app.state.server.gate.in_flight == 0:  # the stalled stream holds the slot
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert http.post("/v1/audio/speech", json={"input": "hi"}).status_code == 429
            started = time.monotonic()
            while (status := http.post("/v1/audio/speech", json={"input": "hi"}).status_code) == 429:
                assert time.monotonic() - started < 10, "the stalled reader kept its slot"
                time.sleep(0.05)
            assert status == 200
            assert len(engine.aborted) == 1  # the stalled request's engine work was aborted
        stalled.close()
    finally:
        live.stop()


def test_stalled_sse_readers_free_their_slots_when_the_engine_is_done(tmp_path):
    """Issue 52: four SSE clients that stopped reading kept their slots until the send timeout,
    though the engine had finished their audio: a fifth request was refused (429) meanwhile.
    Now a stream's bytes are made ahead of its reader (server/run/read_ahead.py) and its slot is
    freed when the engine's audio is all encoded; the send timeout (60 s here) still ends the
    stalled responses later."""
    from live_server import plain_uvicorn, run_in_thread, small_buffer_listener

    from higgs_serve.server.app import build_app

    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=4, max_tokens=20000), chunk_frames=10)
    app = build_app(engine, fake_settings(tmp_path, max_queue=0, max_input_chars=10000, send_timeout_s=60.0))
    live = run_in_thread(app, engine, plain_uvicorn(app), lambda: app.state.server.engine_started, 10,
                         sockets=[small_buffer_listener()])
    # 800 frames of pcm each: 1.5 MB, far past the small socket buffers, so every writer blocks
    stream = {"input": "x" * 400, "response_format": "pcm", "stream": True, "stream_format": "sse"}
    try:
        stalled = [_stalled_stream(live.url, stream) for _ in range(4)]
        with httpx.Client(base_url=live.url, timeout=30) as http:
            started = time.monotonic()
            while (status := http.post("/v1/audio/speech", json={"input": "hi"}).status_code) == 429:
                assert time.monotonic() - started < 20, "the stalled readers kept their slots"
                time.sleep(0.05)
            assert status == 200
        assert engine.aborted == []  # their engine work was not cut: it had finished
        for client in stalled:
            client.close()
    finally:
        live.stop()


# ----------------------------------------------------------------------------- starvation
@pytest.fixture
def small_limits_server(tmp_path):
    settings = fake_settings(tmp_path, max_ref_audio_bytes=30_000)
    encoder = GatedEncoder()
    live = start_threaded_server(FakeEngine(), settings, reference_encoder=encoder)
    yield live, encoder
    live.stop()


def _raw_response_head(url: str, head: bytes, timeout_s: float = 5.0) -> bytes:
    """Send only `head` (request line + headers, no body) and read the response's first bytes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as client:
        client.sendall(head)
        return client.recv(4096)


def test_oversized_bodies_are_refused_before_they_are_read(small_limits_server):
    live, _ = small_limits_server
    limit = live.app.state.server.settings.max_json_body_bytes
    for path in ("/v1/audio/speech", "/v1/audio/voices"):
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {200 * 2**20}\r\n\r\n").encode()
        answer = _raw_response_head(live.url, head)  # no body sent: answered from the headers
        assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
        assert b'"code":"body_too_large"' in answer.replace(b" ", b"")

    def chunked(total: int):
        for _ in range(total // 65536 + 1):
            yield b" " * 65536

    with httpx.Client(base_url=live.url, timeout=30) as http:  # no Content-Length: counted
        response = http.post("/v1/audio/speech", content=chunked(limit + 1),
                             headers={"Content-Type": "application/json"})
        assert response.status_code == 413, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert http.get("/health").status_code == 200


def test_ref_text_is_bounded_like_input(small_limits_server):
    live, _ = small_limits_server
    limit = live.app.state.server.settings.max_input_chars
    with httpx.Client(base_url=live.url, timeout=30) as http:
        response = http.post("/v1/audio/speech", json={
            "input": "hi", "ref_audio": base64.b64encode(tone_wav(1.0, 200)[:20000]).decode(),
            "ref_text": "w" * (limit + 1)})
        assert response.status_code == 413 and response.json()["error"]["param"] == "ref_text"
        response = http.post("/v1/audio/voices", data={"name": "n", "ref_text": "w" * (limit + 1)},
                             files={"audio_sample": ("c.wav", tone_wav(1.0, 200))})
        assert response.status_code == 413 and response.json()["error"]["param"] == "ref_text"


def test_audio_work_runs_on_the_dedicated_pool(small_limits_server):
    live, _ = small_limits_server
    names = []
    live.app.state.server.reference_encoder = lambda audio: (
        names.append(threading.current_thread().name), np.zeros((3, 8), np.int64))[1]
    with httpx.Client(base_url=live.url, timeout=30) as http:
        response = http.post("/v1/audio/speech", json={
            "input": "hi", "ref_audio": base64.b64encode(tone_wav(0.6, 200)).decode()})
        assert response.status_code == 200, response.text
    assert names and all(name.startswith("higgs-audio") for name in names)



def test_a_registered_voice_is_read_encoded_and_stored_on_the_pool(small_limits_server,
                                                                   monkeypatch):
    """A registered voice's first use reads its clip, encodes it and fsyncs its codes: all on
    the audio threads (the read and the write ran on the event loop)."""
    live, _ = small_limits_server
    state = live.app.state.server
    names = {}
    for method in ("load_audio", "store_codes"):
        def spy(*args, _method=method, _inner=getattr(state.voices, method)):
            names[_method] = threading.current_thread().name
            return _inner(*args)
        monkeypatch.setattr(state.voices, method, spy)
    monkeypatch.setattr(state, "reference_encoder", lambda audio: np.zeros((3, 8), np.int64))
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.post("/v1/audio/voices", data={"name": "pooled"},
                         files={"audio_sample": ("c.wav", tone_wav(1.0, 200))}).is_success
        response = http.post("/v1/audio/speech", json={"input": "hi", "voice": "pooled"})
        assert response.status_code == 200, response.text
    assert set(names) == {"load_audio", "store_codes"}
    assert all(name.startswith("higgs-audio") for name in names.values()), names


def test_shutdown_past_the_grace_period_answers_503_and_sse_error(tmp_path):
    """SIGTERM-like stop with a 1 s grace period: a queued request gets an OpenAI-shaped 503 and
    a streaming SSE response ends with a speech.audio.error event (before: a plain-text 500 and
    a stream cut without an event)."""
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=20000), step_delay_s=0.05)
    settings = fake_settings(tmp_path, graceful_shutdown_s=1, max_input_chars=5000)
    live = start_threaded_server(engine, settings, draining=True)
    engine.hold.clear()  # "HOLD..." requests wait before their first chunk: they stay queued
    results = {}

    def queued() -> None:
        results["queued"] = httpx.post(f"{live.url}/v1/audio/speech",
                                       json={"input": "HOLD on"}, timeout=30)

    def sse() -> None:
        with httpx.stream("POST", f"{live.url}/v1/audio/speech", timeout=30, json={
                "input": "x" * 4000, "response_format": "pcm", "stream_format": "sse"}) as stream:
            results["sse"] = [json.loads(line[6:])["type"] for line in stream.iter_lines()
                              if line.startswith("data: ")]

    threads = [threading.Thread(target=queued), threading.Thread(target=sse)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while len(live.app.state.server.generations) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    live.server.should_exit = True
    for thread in threads:
        thread.join(timeout=15)
    live.thread.join(timeout=15)
    assert results["queued"].status_code == 503
    assert results["queued"].json()["error"]["code"] == "shutting_down"
    assert results["sse"][0] == "speech.audio.delta" and results["sse"][-1] == "speech.audio.error"
