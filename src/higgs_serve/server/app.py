"""The FastAPI app (`build_app`) and the one-process server (`run_server`).

The engine is started in the app's lifespan as a background task, so the HTTP port answers
during warm-up: /health is 200, /ready and speech requests are 503 until `engine.ready`. A failed
start stops the server (non-zero exit through `run_server`). On shutdown uvicorn stops accepting,
gives in-flight requests `graceful_shutdown_s` to finish, cancels the rest (each cancellation
aborts its engine request), then the lifespan shuts the engine down.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import uvicorn
from fastapi import Depends, FastAPI, Request

from higgs_serve.deploy_config import DeployConfig
from higgs_serve.engine.async_engine import AsyncEngine
from higgs_serve.engine.builder import RuntimeOptions
from higgs_serve.metrics import ServerMetrics
from higgs_serve.server.errors import ApiError, install_error_handlers
from higgs_serve.server.routers import health, speech, speech_stream, voices
from higgs_serve.server.settings import ServerSettings
from higgs_serve.server.state import AdmissionGate, ReferenceEncoder, ServerState, SpeechEngine
from higgs_serve.voices.registry import VoiceRegistry
from higgs_serve.voices.reference_encoder import ReferenceEncoder as CodecReferenceEncoder

__all__ = ["ServerSettings", "build_app", "run_server"]

logger = logging.getLogger(__name__)


def build_app(engine: SpeechEngine, settings: ServerSettings, *,
              reference_encoder: ReferenceEncoder | None = None,
              on_engine_failure: Callable[[], None] | None = None) -> FastAPI:
    """An app serving `engine`. The lifespan starts and shuts down the engine.

    reference_encoder: enables voice cloning (voice=<registered> and ref_audio); None = 400.
    on_engine_failure: called if `engine.start()` raises (run_server stops uvicorn with it).
    """
    gate = AdmissionGate(engine.deploy.stage0.max_num_seqs + settings.max_queue)
    metrics = ServerMetrics(engine_stats=engine.stats, in_flight=lambda: gate.in_flight,
                            reference_encoder=reference_encoder)
    state = ServerState(engine=engine, settings=settings,
                        voices=VoiceRegistry(settings.voices_dir, engine.sample_rate_hz),
                        metrics=metrics, gate=gate, reference_encoder=reference_encoder)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(_start_engine(state, on_engine_failure))
        try:
            yield
        finally:
            if not starting.done():
                starting.cancel()
            await engine.shutdown()

    app = FastAPI(title="higgs-serve", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible text-to-speech server for Higgs-Audio V3.")
    app.state.server = state
    install_error_handlers(app)
    protected = [Depends(_api_key_checker(settings.api_key))]
    app.include_router(speech.router, dependencies=protected)
    app.include_router(voices.router, dependencies=protected)
    app.include_router(health.router)
    # WebSocket: checks the API key itself (header or api_key query parameter)
    app.include_router(speech_stream.router)
    return app


async def _start_engine(state: ServerState, on_failure: Callable[[], None] | None) -> None:
    try:
        await state.engine.start()
    except asyncio.CancelledError:
        raise
    except Exception as error:  # logged, shown by /health, re-raised by run_server
        logger.exception("the engine failed to start")
        state.engine_start_error = error
        if on_failure is not None:
            on_failure()
        return
    state.engine_started = True
    _attach_step_metrics(state)
    logger.info("engine ready: serving %s", state.settings.served_model_name)


def _attach_step_metrics(state: ServerState) -> None:
    """Feed the Stage 0 step histogram from the engine loop's per-step hook."""
    engine = state.engine
    if isinstance(engine, AsyncEngine) and engine.core is not None:
        engine.core.on_step = state.metrics.observe_step


def _api_key_checker(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        supplied = request.headers.get("authorization", "")
        scheme, _, token = supplied.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
    return check


def run_server(model: str, settings: ServerSettings, deploy: DeployConfig,
               options: RuntimeOptions | None = None,
               reference_encoder: ReferenceEncoder | None = None) -> None:
    """Serve `model` until SIGINT/SIGTERM; raises the engine's error if it failed to start."""
    # Every admitted request waits in the engine before it is scheduled, so the engine's own
    # waiting bound must cover the server's whole in-flight capacity; the server gate decides.
    options = replace(options or RuntimeOptions(),
                      max_waiting=deploy.stage0.max_num_seqs + settings.max_queue)
    settings = replace(settings, model_aliases=(*settings.model_aliases, model))
    engine = AsyncEngine(model, deploy, options)
    if reference_encoder is None:
        # voice cloning: the bundled codec's encoder, built from the loaded checkpoint on first use
        reference_encoder = CodecReferenceEncoder.for_engine(engine)
    server: uvicorn.Server | None = None

    def stop() -> None:
        server.should_exit = True

    app = build_app(engine, settings, reference_encoder=reference_encoder, on_engine_failure=stop)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="on",
                            timeout_graceful_shutdown=settings.graceful_shutdown_s,
                            log_level="info")
    server = uvicorn.Server(config)
    server.run()
    error = server_state_of(app).engine_start_error
    if error is not None:
        raise error


def server_state_of(app: FastAPI) -> ServerState:
    return app.state.server

