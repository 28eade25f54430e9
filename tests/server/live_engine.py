"""The real engine (tiny checkpoint, CPU) behind a real uvicorn server in this process, so tests
can look at what the server submitted to the engine. `RecordingEngine` passes every call through
to the `AsyncEngine` and keeps each submitted request and its stream."""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from higgs_serve.cli import deploy_from_args
from higgs_serve.engine.async_engine import AsyncEngine, RequestStream
from higgs_serve.engine.builder import RuntimeOptions
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.server.app import build_app
from higgs_serve.server.settings import ServerSettings
from higgs_serve.voices.reference_encoder import ReferenceEncoder


class RecordingEngine:
    """An AsyncEngine that remembers what it was asked (tests read `submitted`)."""

    def __init__(self, engine: AsyncEngine):
        self.inner = engine
        self.submitted: list[tuple[SpeechRequest, RequestStream]] = []

    def __getattr__(self, name):  # everything else: the real engine's
        return getattr(self.inner, name)

    def generate(self, request: SpeechRequest) -> RequestStream:
        stream = self.inner.generate(request)
        self.submitted.append((request, stream))
        return stream


@dataclass
class LiveEngineServer:
    app: FastAPI
    engine: RecordingEngine
    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_live_engine_server(model_dir: Path, settings: ServerSettings, max_num_seqs: int = 2,
                             max_tokens: int = 200) -> LiveEngineServer:
    capture = list(range(1, min(max_num_seqs, 2) + 1))
    overrides = json.dumps({"0": {"default_sampling_params": {"max_tokens": max_tokens},
                                  "compilation_config": {"cudagraph_capture_sizes": capture}}})
    args = argparse.Namespace(deploy_config=None, stage_overrides=overrides, device="cpu",
                              max_num_seqs=max_num_seqs)
    deploy = deploy_from_args(args, model_dir)
    options = RuntimeOptions(device="cpu", max_waiting=max_num_seqs + settings.max_queue)
    engine = RecordingEngine(AsyncEngine(str(model_dir), deploy, options))
    app = build_app(engine, settings, reference_encoder=ReferenceEncoder.for_engine(engine.inner))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn-engine", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (server.started and app.state.server.engine_ready()):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server did not start: {app.state.server.engine_start_error}")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return LiveEngineServer(app, engine, server, thread, f"http://127.0.0.1:{port}")
