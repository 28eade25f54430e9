"""The real engine (tiny checkpoint, CPU) behind a real uvicorn server in this process, so tests
can look at what the server submitted to the engine. `RecordingEngine` passes every call through
to the `AsyncEngine` and keeps each submitted request and its stream."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from higgs_serve.cli import deploy_from_args
from higgs_serve.engine.async_engine import AsyncEngine, RequestStream
from higgs_serve.engine.builder import RuntimeOptions
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.server.app import build_app
from higgs_serve.server.settings import ServerSettings
from higgs_serve.voices.reference_encoder import ReferenceEncoder
from live_server import ThreadedServer, plain_uvicorn, run_in_thread


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


def start_live_engine_server(model_dir: Path, settings: ServerSettings, max_num_seqs: int = 2,
                             max_tokens: int = 200, sockets=None,
                             wrap: type[RecordingEngine] = RecordingEngine) -> ThreadedServer:
    """wrap: the RecordingEngine (sub)class the server gets (a test's own hooks on the engine)."""
    capture = list(range(1, min(max_num_seqs, 2) + 1))
    # the default profile: the deadline policy off (tests compare one seed's audio across requests,
    # and the policy's ramp would move the seams with the load: test_chunker.py pins it)
    overrides = json.dumps({"0": {"default_sampling_params": {"max_tokens": max_tokens},
                                  "compilation_config": {"cudagraph_capture_sizes": capture}}})
    args = argparse.Namespace(deploy_config=None, stage_overrides=overrides, device="cpu",
                              max_num_seqs=max_num_seqs)
    deploy = deploy_from_args(args, model_dir)
    options = RuntimeOptions(device="cpu", max_waiting=max_num_seqs + settings.max_queue)
    engine = wrap(AsyncEngine(str(model_dir), deploy, options))
    app = build_app(engine, settings, reference_encoder=ReferenceEncoder.for_engine(engine.inner))
    state = app.state.server
    return run_in_thread(app, engine, plain_uvicorn(app), state.engine_ready, timeout_s=120,
                         why_not=lambda: f": {state.engine_start_error}", name="test-uvicorn-engine",
                         poll_s=0.05, join_timeout_s=30, sockets=sockets)
