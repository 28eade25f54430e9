"""The data-parallel front end (relay + control plane, cluster/frontend.py) served in a thread
of the test process on a free port, over replicas the test provides (Unix sockets): stand-in
apps (`stand_in_app`) served by uvicorn, or servers of the test's own."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from higgs_serve.cluster.frontend import Frontend, FrontendSettings, serve_frontend
from higgs_serve.cluster.replicas import Replica
from higgs_serve.cluster.routing import Router


@contextmanager
def frontend_thread(frontend: Frontend, work: Path) -> Iterator[str]:
    """Yields the front end's http URL once it listens; stops it (as SIGTERM would) after."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    loops: list[asyncio.AbstractEventLoop] = []
    stop = asyncio.Event()
    started = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        # a Runner, as `higgs-serve` runs it: at the end it cancels what is left (a supervisor
        # poll in flight) and closes the loop; a loop left open leaves tasks for the garbage
        # collector to destroy later, in whatever test runs then
        try:
            with asyncio.Runner() as runner:
                loops.append(runner.get_loop())
                runner.run(serve_frontend(frontend, listener, work, stop, started.set))
        except BaseException as error:  # shown by the test
            failed.append(error)
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(20) and not failed, failed
    try:
        yield url
    finally:
        loops[0].call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the front end did not stop"
        assert not failed, failed


def serve_app_on_socket(app, path: Path) -> tuple[uvicorn.Server, threading.Thread]:
    """A uvicorn server for `app` on the Unix socket `path` (a stand-in replica), started."""
    server = uvicorn.Server(uvicorn.Config(app, uds=str(path), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return server, thread


def wait_until(predicate, timeout_s: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stand_in_app() -> FastAPI:
    """A stand-in replica with what the supervisor polls and syncs (/ready, /metrics, an empty
    voice list); the test adds the routes it drives."""
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

    return app


@contextmanager
def front_end_over(app: FastAPI, work: Path, capacity: int = 8,
                   **settings) -> Iterator[tuple[str, Frontend]]:
    """(url, front end) over one stand-in replica "A" serving `app`, once it is ready;
    `settings`: FrontendSettings fields."""
    server, thread = serve_app_on_socket(app, work / "A.sock")
    replicas = {"A": Replica(id="A", socket_path=work / "A.sock")}
    frontend = Frontend(replicas, Router({"A": capacity}), work / "voices", 24000,
                        FrontendSettings(**settings), poll_interval_s=0.05)
    try:
        with frontend_thread(frontend, work) as url:
            wait_until(lambda: frontend.ready_replicas(), what="the replica ready")
            yield url, frontend
    finally:
        server.should_exit = True
        thread.join(timeout=10)
