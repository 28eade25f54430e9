"""Live test servers on 127.0.0.1: uvicorn in a background thread (fake engine)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from higgs_serve.server.app import build_app
from higgs_serve.server.settings import ServerSettings
from fake_engine import FakeEngine

MODEL_NAME = "higgs-test"


@dataclass
class ThreadedServer:
    app: FastAPI
    engine: FakeEngine
    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_threaded_server(engine: FakeEngine, settings: ServerSettings) -> ThreadedServer:
    """Serve build_app(engine, settings) on 127.0.0.1 (port chosen by the OS); wait until ready."""
    app = build_app(engine, settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not (server.started and app.state.server.engine_started):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return ThreadedServer(app, engine, server, thread, f"http://127.0.0.1:{port}")


def fake_settings(tmp_path, **overrides) -> ServerSettings:
    values = dict(served_model_name=MODEL_NAME, voices_dir=tmp_path / "voices", max_queue=1,
                  max_input_chars=200)
    values.update(overrides)
    return ServerSettings(**values)
