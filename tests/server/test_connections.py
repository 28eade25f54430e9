"""The single server's connections (server/limits/connections.py), with real clients and sockets:

- issue 61 item 4: an early 413 (a declared length over the limit, answered before the body is
  read) reaches clients that send their whole body before they read (urllib, requests) instead
  of a connection reset: the server closes with a lingering close, as the front end does;
- issue 61 item 5: with the open-file limit at 1,024 and 1,074 connections open that never send
  a request head, a new client that sends its request at once is served (the oldest connection
  without a head is closed for it), and the server logs no accept errors.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import pytest
import requests

from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, free_port, run_in_thread, wait_ready

from higgs_serve.server.app import build_app, draining_server

REPO = Path(__file__).resolve().parents[2]
REF_BYTES = 3 * 1024  # max_ref_audio_bytes: the JSON body limit is 1 MiB + 4 KiB
BODY = b'{"input": "' + b"x" * (24 << 20) + b'"}'  # 24 MiB: far past the limit and the socket buffers


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """run_server's uvicorn (draining_server: the connection handling under test) on a fake engine."""
    engine = FakeEngine(deploy=fake_deploy())
    app = build_app(engine, fake_settings(tmp_path_factory.mktemp("conn"), max_ref_audio_bytes=REF_BYTES))
    live = run_in_thread(app, engine, draining_server(app, "127.0.0.1", 0, log_level="warning"),
                         lambda: app.state.server.engine_started, timeout_s=10)
    yield live
    live.stop()


def test_urllib_sending_its_whole_body_first_reads_the_413(server):
    request = urllib.request.Request(f"{server.url}/v1/audio/speech", data=BODY,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(request, timeout=30)
    assert answered.value.code == 413
    error = json.loads(answered.value.read())["error"]
    assert error["code"] == "body_too_large" and "limit" in error["message"]


def test_requests_sending_its_whole_body_first_reads_the_413(server):
    answer = requests.post(f"{server.url}/v1/audio/speech", data=BODY,
                           headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large"
    upload = requests.post(f"{server.url}/v1/audio/watermark/detect", timeout=60,
                           files={"file": ("big.wav", b"\0" * (33 << 20))})  # past 32 MiB + envelope
    assert upload.status_code == 413 and upload.json()["error"]["code"] == "body_too_large"


def test_the_connection_still_serves_after_a_whole_request(server):
    """The lingering close is for answers sent before the body was read; an answered request
    keeps its connection (keep-alive) as before."""
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(f"{server.url}/health", timeout=10).status_code == 200


# ---------------------------------------------------------------------------- the connection cap
OPEN_FILES = 1024
IDLE = 1074
SERVE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({open_files}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings
from higgs_serve.server.app import build_app, draining_server
from pathlib import Path
app = build_app(FakeEngine(deploy=fake_deploy()), fake_settings(Path(sys.argv[1])))
draining_server(app, "127.0.0.1", int(sys.argv[2]), log_level="warning").run()
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < IDLE + 200,
                    reason="this test opens 1,074 connections: needs a higher hard open-file limit")
def test_idle_connections_past_the_open_file_limit_do_not_lock_a_client_out(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, IDLE + 200), hard))  # this process's own
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "tests" / "server"),
                                                        os.environ.get("PYTHONPATH", "")])}
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", SERVE.format(open_files=OPEN_FILES), str(tmp_path), str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    idle: list[socket.socket] = []
    try:
        wait_ready(url, proc, str(log_path), 60)
        for _ in range(IDLE):  # connected, never a byte sent
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(1.0)  # the server accepts them all (the kernel queued them)
        started = time.monotonic()
        answer = httpx.get(f"{url}/health", timeout=20)
        served_s = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        closed = sum(_closed_by_server(sock) for sock in idle)
        assert closed >= IDLE + 1 - OPEN_FILES  # the oldest of them made room
        assert served_s < 10
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        proc.wait(30)
    log = log_path.read_text()
    assert "out of system resource" not in log and "Traceback" not in log, log[-3000:]


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_the_caps_leave_room_below_the_open_file_limit(monkeypatch):
    """The single server keeps a quarter of the limit for its own files; the front end, two
    descriptors a relayed connection, 64 for its own (one rule: connection_cap)."""
    from higgs_serve.cluster.relay.connections import default_cap
    from higgs_serve.server.limits.connections import server_cap

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert server_cap() == 768 and default_cap() == 480
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert server_cap() == (1 << 20) * 3 // 4
