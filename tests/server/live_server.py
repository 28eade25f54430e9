"""Live test servers on 127.0.0.1: uvicorn in a background thread (fake engine), or the real
`higgs_serve.cli serve` in a subprocess (real engine, tiny checkpoint)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from higgs_serve.server.app import build_app, draining_server
from higgs_serve.server.settings import ServerSettings
from fake_engine import FakeEngine

MODEL_NAME = "higgs-test"


@dataclass
class ThreadedServer:
    app: FastAPI
    engine: Any  # FakeEngine here; live_engine.RecordingEngine for the real engine
    server: uvicorn.Server
    thread: threading.Thread
    url: str
    join_timeout_s: float = 10.0

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=self.join_timeout_s)


def plain_uvicorn(app: FastAPI) -> uvicorn.Server:
    """uvicorn on 127.0.0.1, port chosen by the OS, with a 2 s grace period on shutdown."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning",
                            timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


def run_in_thread(app: FastAPI, engine: Any, server: uvicorn.Server, ready: Callable[[], bool],
                  timeout_s: float, why_not: Callable[[], str] = lambda: "",
                  name: str = "test-uvicorn", poll_s: float = 0.01,
                  join_timeout_s: float = 10.0,
                  sockets: list[socket.socket] | None = None) -> ThreadedServer:
    """Run `server` in a daemon thread; return once it listens and `ready()` holds, or raise
    (with `why_not()`) if the thread dies or `timeout_s` passes first. sockets: listening
    sockets to serve on (e.g. with small buffers), instead of uvicorn binding its own."""
    thread = threading.Thread(target=lambda: server.run(sockets=sockets), name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not (server.started and ready()):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server did not start{why_not()}")
        time.sleep(poll_s)
    port = server.servers[0].sockets[0].getsockname()[1]
    return ThreadedServer(app, engine, server, thread, f"http://127.0.0.1:{port}", join_timeout_s)


def start_threaded_server(engine: FakeEngine, settings: ServerSettings, draining: bool = False,
                          **app_options) -> ThreadedServer:
    """Serve build_app(engine, settings, **app_options) on 127.0.0.1 (port chosen by the OS);
    wait until ready. draining: run_server's uvicorn (settings.graceful_shutdown_s, then abort)
    instead of a plain one with a 2 s grace period."""
    app = build_app(engine, settings, **app_options)
    server = (draining_server(app, "127.0.0.1", 0, log_level="warning") if draining
              else plain_uvicorn(app))
    return run_in_thread(app, engine, server, lambda: app.state.server.engine_started, timeout_s=10)


def fake_settings(tmp_path, **overrides) -> ServerSettings:
    values = dict(served_model_name=MODEL_NAME, voices_dir=tmp_path / "voices", max_queue=1,
                  max_input_chars=200)
    values.update(overrides)
    return ServerSettings(**values)


# ----------------------------------------------------------------------------- real server
@dataclass
class Subprocess:
    url: str
    process: subprocess.Popen
    log_path: str


def small_buffer_listener(send_buffer_bytes: int = 32 * 1024) -> socket.socket:
    """A listening socket on a free loopback port whose accepted connections send through a
    small, fixed kernel buffer (Linux hands the listener's SO_SNDBUF to them): a client that
    stops reading blocks the server's writes within a second, not after megabytes."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, log_path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{open(log_path).read()}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not ready after {timeout_s} s:\n{open(log_path).read()}")


@contextmanager
def serve_subprocess(model_dir: Path, work: Path, args: list[str]) -> Iterator[Subprocess]:
    """`higgs_serve.cli serve model_dir <args>` on CPU on a free loopback port, logging to
    work/server.log; yields once /ready answers 200. On exit: SIGTERM, and asserts the server
    shut down gracefully within 30 s (killed if it did not exit)."""
    port = free_port()
    command = [
        sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve",
        str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", *args,
    ]
    log_path = str(work / "server.log")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path, timeout_s=120)
        yield Subprocess(url, process, log_path)
    finally:
        process.terminate()  # SIGTERM: graceful shutdown
        try:
            # uvicorn re-raises SIGTERM after its graceful shutdown, hence -15
            assert process.wait(timeout=30) in (0, -15), open(log_path).read()
        finally:
            if process.poll() is None:
                process.kill()


def metric(http: httpx.Client, name: str) -> float:
    """The value of an unlabelled (or fully spelled-out labelled) sample in /metrics."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not exported")


async def until(condition: Callable[[], bool], timeout_s: float) -> None:
    """Wait on the event loop until `condition()` holds, failing the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def assigned_streams(pool) -> int:
    """Responses counted on an encode pool's processes (open, not yet closed or released)."""
    return sum(p.streams for p in pool._processes)
