"""The API key on every /v1 route, and the rules for fetching `ref_audio` URLs (issue 28).
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from fake_engine import FakeEngine, fake_deploy
from hostile import tone_wav
from live_server import fake_settings, free_port, start_threaded_server

from higgs_serve.errors import ConfigError
from higgs_serve.server.plan import ref_audio


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
    with pytest.raises(ConfigError, match="--api-key"):
        fake_settings(tmp_path, api_key=api_key)



# ----------------------------------------------------------------------------- URL fetches
class _ClipServer:
    """A loopback HTTP server: /clip answers a 1 s WAV, /drip a body one byte per 50 ms."""

    def __init__(self):
        clip, hits = tone_wav(1.0, 220), []

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
        ("http://127.0.0.1:99999/clip", "invalid port"),
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
