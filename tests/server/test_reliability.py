"""Hostile input and faults (issue 28), kept as a CI-size regression suite.

Against the real server (`higgs_serve.cli serve <tiny model>` in a subprocess, measured from the
outside): reference-clip bombs cost little memory and /health keeps answering. The fast,
fake-engine cases (slow readers, body limits, races, auth) live beside it in this module.
"""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import soundfile as sf
from bombs import bombs
from fake_engine import FakeEngine, fake_deploy
from fuzz import clamp_frame_fields, fuzz_server
from live_server import (
    Subprocess,
    fake_settings,
    free_port,
    serve_subprocess,
    start_threaded_server,
)

from higgs_serve.errors import ConfigError
from higgs_serve.server import ref_audio

NAME = "higgs-tiny-hostile"
RSS_GROWTH_LIMIT = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def real_server(tiny_model_dir, tmp_path_factory) -> Subprocess:
    work = tmp_path_factory.mktemp("hostile")
    args = ["--served-model-name", NAME, "--voices-dir", str(work / "voices"),
            "--stage-overrides", json.dumps({"0": {"max_model_len": 512}})]
    with serve_subprocess(tiny_model_dir, work, args) as server:
        yield server


def _peak_rss_bytes(pid: int) -> int:
    """The process's high-water resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_reference_bombs_are_refused_with_little_memory(real_server):
    """Each bomb (8-channel silence, a 1 Hz header, 20 minutes of FLAC without a length, ...) is
    a 400 naming its field, through `ref_audio` and a voice upload alike, and the server's peak
    RSS grows by less than 200 MB over all of them (it grew by 1.4-1.8 GB per bomb before)."""
    before = _peak_rss_bytes(real_server.process.pid)
    latencies, stop = [], threading.Event()

    def poll_health() -> None:  # /health must answer within 1 s throughout
        with httpx.Client(base_url=real_server.url, timeout=1.0) as health:
            while not stop.is_set():
                started = time.monotonic()
                assert health.get("/health").status_code == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.05)

    poller = ThreadPoolExecutor(1).submit(poll_health)
    with httpx.Client(base_url=real_server.url, timeout=60) as http:
        for name, data in bombs():
            started = time.monotonic()
            response = http.post("/v1/audio/speech", json={
                "input": "hi", "ref_audio": base64.b64encode(data).decode()})
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error"]["param"] == "ref_audio", name
            response = http.post("/v1/audio/voices", data={"name": "bomb"},
                                 files={"audio_sample": ("bomb.bin", data)})
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error"]["param"] == "audio_sample", name
            assert time.monotonic() - started < 10, name
            assert http.get("/health").status_code == 200
        assert http.get("/v1/audio/voices").json()["data"] == []
    stop.set()
    poller.result()  # re-raises a /health timeout
    assert latencies and max(latencies) < 1.0
    growth = _peak_rss_bytes(real_server.process.pid) - before
    assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew by {growth / 2**20:.0f} MB"


def test_a_prompt_too_long_for_the_model_is_413_on_input(real_server):
    """The real engine (max_model_len 512 here): a prompt that leaves no room to speak is a 413
    naming `input` (before: a 400 on max_new_tokens carrying an internal request id)."""
    text = " ".join(f"word{i}" for i in range(400))  # < 4096 chars, > 512 tokens
    response = httpx.post(f"{real_server.url}/v1/audio/speech", json={"input": text}, timeout=60)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("input", "input_too_long")
    assert "leave room to speak" in error["message"] and "speech-" not in error["message"]


# ----------------------------------------------------------------------------- voices (fake engine)
def _clip(seconds: float, freq_hz: float) -> bytes:
    t = np.arange(int(seconds * 24000)) / 24000
    buffer = io.BytesIO()
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32), 24000,
             format="WAV", subtype="PCM_16")
    return buffer.getvalue()


class GatedEncoder:
    """A reference encoder whose next call can be held: `entered` is set when it starts, and it
    returns only once `release` is set. Codes encode the clip's length, to tell clips apart."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()
        self.calls: list[int] = []

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        self.calls.append(audio.shape[0])
        self.entered.set()
        assert self.release.wait(10)
        return np.full((3, 8), audio.shape[0] % 1000, dtype=np.int64)


@pytest.fixture
def voice_server(tmp_path):
    encoder = GatedEncoder()
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200))
    live = start_threaded_server(engine, fake_settings(tmp_path), reference_encoder=encoder)
    yield live, encoder
    live.stop()


def test_a_voice_replaced_while_encoding_keeps_its_own_codes(voice_server):
    """Deterministic interleaving: a speech request encodes voice v (held in the encoder); v is
    deleted and registered again with another clip; the request finishes. The new v must not
    get the old clip's codes (before: they were written into it and persisted)."""
    live, encoder = voice_server
    registry = live.app.state.server.voices
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.post("/v1/audio/voices", data={"name": "v"},
                         files={"audio_sample": ("a.wav", _clip(1.0, 220))}).is_success
        encoder.release.clear()
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(http.post, "/v1/audio/speech", json={"input": "hi", "voice": "v"})
            assert encoder.entered.wait(10)
            assert http.delete("/v1/audio/voices/v").status_code == 200
            assert http.post("/v1/audio/voices", data={"name": "v"},
                             files={"audio_sample": ("b.wav", _clip(2.0, 330))}).is_success
            encoder.release.set()
            assert first.result().status_code == 200  # it began before the delete: served
        assert registry.cached_codes("v") is None
        assert not (registry.directory / "v" / "codes.npy").exists()
        assert http.post("/v1/audio/speech", json={"input": "hi", "voice": "v"}).status_code == 200
    assert encoder.calls == [24000, 48000]  # the new voice was encoded from its own clip
    assert registry.cached_codes("v")[0, 0] == 48000 % 1000


def test_concurrent_registrations_of_one_name_are_one_success_and_409s(voice_server):
    live, _ = voice_server
    barrier = threading.Barrier(4)

    def register(freq_hz: float) -> int:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            barrier.wait()
            return http.post("/v1/audio/voices", data={"name": "same"},
                             files={"audio_sample": ("c.wav", _clip(1.0, freq_hz))}).status_code

    with ThreadPoolExecutor(4) as pool:
        statuses = sorted(pool.map(register, [200, 300, 400, 500]))
    assert statuses[0] < 300 and statuses[1:] == [409, 409, 409], statuses


def test_a_voice_folder_without_audio_is_not_listed_and_never_500s(tmp_path):
    voices = tmp_path / "voices"
    (voices / "ghost").mkdir(parents=True)
    (voices / "ghost" / "voice.json").write_text(json.dumps({
        "name": "ghost", "ref_text": None, "created_at": 0, "duration_s": 1.0,
        "sample_rate_hz": 24000}))
    (voices / "empty").mkdir()
    (voices / "empty" / "voice.json").write_text("")
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path),
                                 reference_encoder=GatedEncoder())
    try:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            assert http.get("/v1/audio/voices").json()["data"] == []
            response = http.post("/v1/audio/speech", json={"input": "hi", "voice": "ghost"})
            assert response.status_code == 400 and response.json()["error"]["param"] == "voice"
    finally:
        live.stop()


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
            "input": "hi", "ref_audio": base64.b64encode(_clip(1.0, 200)[:20000]).decode(),
            "ref_text": "w" * (limit + 1)})
        assert response.status_code == 413 and response.json()["error"]["param"] == "ref_text"
        response = http.post("/v1/audio/voices", data={"name": "n", "ref_text": "w" * (limit + 1)},
                             files={"audio_sample": ("c.wav", _clip(1.0, 200))})
        assert response.status_code == 413 and response.json()["error"]["param"] == "ref_text"


def test_audio_work_runs_on_the_dedicated_pool(small_limits_server):
    live, _ = small_limits_server
    names = []
    live.app.state.server.reference_encoder = lambda audio: (
        names.append(threading.current_thread().name), np.zeros((3, 8), np.int64))[1]
    with httpx.Client(base_url=live.url, timeout=30) as http:
        response = http.post("/v1/audio/speech", json={
            "input": "hi", "ref_audio": base64.b64encode(_clip(0.6, 200)).decode()})
        assert response.status_code == 200, response.text
    assert names and all(name.startswith("higgs-audio") for name in names)


# ----------------------------------------------------------------------------- auth
def _routes(app) -> list:
    """Every route of the app (FastAPI keeps included routers as nested route groups)."""
    routes = []
    for route in app.routes:
        if hasattr(route, "effective_route_contexts"):
            routes += list(route.effective_route_contexts())
        else:
            routes.append(route)
    return routes


def _v1_operations(app) -> list[tuple[str, str]]:
    """(method, path) of every /v1 route, path parameters filled in."""
    operations = []
    for route in _routes(app):
        if route.path.startswith("/v1"):
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            operations += [(method, path) for method in sorted(route.methods)]
    return operations


def test_every_v1_route_needs_the_key_and_odd_headers_are_401(tmp_path):
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path, api_key="s3cret"))
    try:
        operations = _v1_operations(live.app)
        assert ("GET", "/v1/models") in operations and len(operations) >= 5
        with httpx.Client(base_url=live.url, timeout=30) as http:
            for method, path in operations:
                for headers in ({}, {"Authorization": "Bearer wrong"},
                                {"Authorization": "Bearer s3cr\xe9t".encode("latin-1")},  # non-ASCII
                                {"Authorization": b"Bearer \xc3\xa9\xff"}, {"Authorization": ""},
                                {"Authorization": "Basic s3cret"}):
                    response = http.request(method, path, headers=headers)
                    assert response.status_code == 401, (method, path, headers, response.text)
                    assert response.json()["error"]["code"] == "invalid_api_key"
            good = {"Authorization": "Bearer s3cret"}
            assert http.get("/v1/models", headers=good).status_code == 200
            assert http.get("/health").status_code == 200  # health and metrics stay open
            schema = http.get("/openapi.json").json()
        assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
        for path, item in schema["paths"].items():
            for operation in item.values():
                assert (operation.get("security") is not None) == path.startswith("/v1"), path
    finally:
        live.stop()


@pytest.mark.parametrize("api_key", ["", "   ", "cl\xe9"])
def test_an_empty_or_non_ascii_api_key_is_refused_at_startup(api_key, tmp_path):
    with pytest.raises(ConfigError, match="api_key"):
        fake_settings(tmp_path, api_key=api_key)


# ----------------------------------------------------------------------------- small 500s
def test_an_empty_json_key_is_a_400_naming_it(fake_server):
    response = httpx.post(f"{fake_server.url}/v1/audio/speech", json={"input": "hi", "": 0})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == '""'


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


# ----------------------------------------------------------------------------- the document
def test_openapi_documents_metrics_as_text_and_the_error_statuses(fake_server):
    schema = httpx.get(f"{fake_server.url}/openapi.json").json()
    metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    for path, methods in [("/v1/audio/speech", ["post"]), ("/v1/audio/voices", ["get", "post"]),
                          ("/v1/audio/voices/{name}", ["delete"]), ("/v1/models", ["get"])]:
        assert sorted(schema["paths"][path]) == methods  # no OPTIONS/HEAD operations
        for method in methods:
            assert "500" in schema["paths"][path][method]["responses"], (path, method)
    assert "404" in schema["paths"]["/v1/audio/speech"]["post"]["responses"]


def test_an_empty_ref_text_is_accepted(fake_server):
    response = httpx.post(f"{fake_server.url}/v1/audio/speech", json={"input": "hi", "ref_text": ""})
    assert response.status_code == 200, response.text



# ----------------------------------------------------------------------------- URL fetches
class _ClipServer:
    """A loopback HTTP server: /clip answers a 1 s WAV, /drip a body one byte per 50 ms."""

    def __init__(self):
        clip, hits = _clip(1.0, 220), []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(clip)))
                self.end_headers()
                if self.path != "/drip":
                    self.wfile.write(clip)
                    return
                for byte in clip[:400]:  # 20 s at this pace: only an overall deadline stops it
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)

            def log_message(self, *_args) -> None:
                pass

        self.hits = hits
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def url_server(tmp_path, monkeypatch):
    monkeypatch.setattr(ref_audio, "FETCH_DEADLINE_S", 1.0)
    clips = _ClipServer()
    closed_port = free_port()
    allowed = (f"127.0.0.1:{clips.port}", f"127.0.0.1:{closed_port}", f"localhost:{clips.port}",
               "127.0.0.1")
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=1))
    live = start_threaded_server(engine, fake_settings(tmp_path, allowed_ref_audio_domains=allowed,
                                                        max_queue=0),
                                 reference_encoder=lambda audio: np.zeros((3, 8), np.int64))
    yield live, clips, closed_port
    live.stop()
    clips.close()


def _speak(live, ref_audio: str) -> httpx.Response:
    return httpx.post(f"{live.url}/v1/audio/speech", json={"input": "hi", "ref_audio": ref_audio},
                      timeout=30)


def test_url_fetch_rules(url_server):
    live, clips, closed_port = url_server
    base = f"http://127.0.0.1:{clips.port}"
    assert _speak(live, f"{base}/clip").status_code == 200  # the listed address and port
    started = time.monotonic()
    drip = _speak(live, f"{base}/drip")  # one overall deadline, not one per read
    assert drip.status_code == 400 and time.monotonic() - started < 3
    closed = _speak(live, f"http://127.0.0.1:{closed_port}/clip")
    assert closed.status_code == 400
    # a closed port and a slow or filtered one read alike
    assert closed.json()["error"]["message"] == drip.json()["error"]["message"]
    assert "could not be fetched" in closed.json()["error"]["message"]
    cases = [
        (f"http://localhost:{clips.port}/clip", "non-public address"),  # named host -> loopback
        (f"http://127.0.0.1:{clips.port + 1}/clip", "port"),  # "127.0.0.1" alone: 80/443 only
        (f"http://127.0.0.1\t:{clips.port}/clip", "control characters"),
        (f"http://127.0.0.1:{clips.port}\t/clip", "control characters"),
        (f"http://user:pw@127.0.0.1:{clips.port}/clip", "user info"),
        (f"http://127.0.0.1:99999/clip", "invalid port"),
    ]
    for url, phrase in cases:
        response = _speak(live, url)
        assert response.status_code == 400, (url, response.text)
        assert phrase in response.json()["error"]["message"], (url, response.text)
        assert response.json()["error"]["param"] == "ref_audio"
    assert clips.hits == ["/clip", "/drip"]  # nothing else reached the clip server


def test_url_fetches_wait_for_admission(url_server):
    """At capacity, a URL reference is a 429 before anything is fetched."""
    live, clips, _ = url_server
    live.engine.hold.clear()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, f"{live.url}/v1/audio/speech", json={"input": "HOLD"},
                           timeout=30)
        deadline = time.monotonic() + 5
        while live.app.state.server.gate.in_flight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _speak(live, f"http://127.0.0.1:{clips.port}/clip").status_code == 429
        live.engine.hold.set()
        assert held.result().status_code == 200
    assert clips.hits == []


# ----------------------------------------------------------------------------- fuzzing
def test_fuzzing_every_operation_with_and_without_the_key_gives_no_5xx(tmp_path):
    """schemathesis over every operation (GET included) of a server with an API key, first with
    the key, then with a wrong one: never a 5xx, the engine alive after each case."""
    settings = fake_settings(tmp_path, api_key="k3y", max_ref_audio_bytes=50_000)
    live = start_threaded_server(FakeEngine(), settings,
                                 reference_encoder=lambda audio: np.zeros((3, 8), np.int64))
    try:
        openapi = httpx.get(f"{live.url}/openapi.json").json()
        openapi = clamp_frame_fields(openapi, 20)
        every = ("GET", "POST", "DELETE")
        fuzz_server(live.url, openapi, max_examples=6, headers={"Authorization": "Bearer k3y"},
                    methods=every)
        fuzz_server(live.url, openapi, max_examples=2, headers={"Authorization": "Bearer no"},
                    methods=every)
    finally:
        live.stop()


def _hostile_bodies() -> list[tuple[str, bytes | dict]]:
    return [
        ("empty key", {"input": "hi", "": 0}),
        ("control tokens in input", {"input": "<|audio|><|endoftext|><|tts|> hi"}),
        ("control tokens in ref_text", {"input": "hi", "ref_text": "<|ref_audio|>"}),
        ("NaN speed", b'{"input": "hi", "speed": NaN}'),
        ("Infinity temperature", b'{"input": "hi", "temperature": Infinity}'),
        ("deep nesting", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("huge int", b'{"input": "hi", "seed": ' + b"9" * 5000 + b"}"),
        ("lone surrogate", b'{"input": "\\ud800"}'),
        ("nul in input", {"input": "hi\x00there"}),
        ("utf-16 body", '{"input": "hi"}'.encode("utf-16")),
        ("voice with newline", {"input": "hi", "voice": "evil\n"}),
        ("model with newline", {"input": "hi", "model": "x\r\nSet-Cookie: a=b"}),
        ("ref_audio tab url", {"input": "hi", "ref_audio": "http://exa\tmple.com/a.wav"}),
        ("ref_audio 1 Hz wav", {"input": "hi", "ref_audio": base64.b64encode(
            bombs()[1][1]).decode()}),
    ]


def test_hostile_bodies_never_get_a_5xx(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=30) as http:
        for case, body in _hostile_bodies():
            if isinstance(body, dict):
                response = http.post("/v1/audio/speech", json=body)
            else:
                response = http.post("/v1/audio/speech", content=body,
                                     headers={"Content-Type": "application/json"})
            assert response.status_code < 500, (case, response.status_code, response.text)
            if response.status_code != 200:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}, case
            assert http.get("/health").status_code == 200, case
        for name in ("evil%0A", "a%00b", "..", "%2e%2e%2fetc"):
            assert http.delete(f"/v1/audio/voices/{name}").status_code in (400, 404), name
            response = http.post("/v1/audio/voices", data={"name": name.replace("%0A", "\n")},
                                 files={"audio_sample": ("a.wav", _clip(1.0, 200))})
            assert response.status_code == 400, (name, response.text)
