"""The FastAPI app (`build_app`) and the one-process server (`run_server`).

The engine is started in the app's lifespan as a background task, so the HTTP port answers
during warm-up: /health is 200, /ready and speech requests are 503 until `engine.ready`. A failed
start stops the server (non-zero exit through `run_server`). On shutdown uvicorn stops accepting
(and closes WebSocket sessions at once), gives in-flight requests `graceful_shutdown_s` to finish;
then `DrainingServer` aborts what is left, each request answering for itself within
SHUTDOWN_ABORT_WINDOW_S, and the lifespan shuts the engine down.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial

import uvicorn
from fastapi import FastAPI, Security
from fastapi.security import HTTPBearer

from higgs_serve.config.deploy import DeployConfig
from higgs_serve.engine.async_engine import AsyncEngine
from higgs_serve.engine.builder import RuntimeOptions
from higgs_serve.engine.core import EngineHooks
from higgs_serve.metrics import ServerMetrics
from higgs_serve.server.auth import ApiKeyMiddleware
from higgs_serve.server.errors import install_error_handlers
from higgs_serve.server.limits.body_limit import BodyLimitMiddleware
from higgs_serve.server.limits.connections import ServerConnection, server_cap
from higgs_serve.audio.provenance import Provenance
from higgs_serve.audio.watermark_detect import DETECT_MAX_BYTES
from higgs_serve.server.routers import health, speech, speech_batch, speech_stream, voices, watermark
from higgs_serve.server.routers.playground import add_playground
from higgs_serve.server.schemas import ERROR_RESPONSES
from higgs_serve.server.limits.send_timeout import SendTimeoutMiddleware
from higgs_serve.server.settings import MULTIPART_OVERHEAD_BYTES, ServerSettings
from higgs_serve.server.state import AdmissionGate, ReferenceEncoder, ServerState, SpeechEngine
from higgs_serve.voices.registry import MAX_UPLOAD_BYTES, VoiceRegistry
from higgs_serve.voices.reference_encoder import ReferenceEncoder as CodecReferenceEncoder

__all__ = ["ServerSettings", "build_app", "run_server"]

logger = logging.getLogger(__name__)
_BEARER = HTTPBearer(auto_error=False, description="the server's --api-key")


def build_app(engine: SpeechEngine, settings: ServerSettings, *,
              reference_encoder: ReferenceEncoder | None = None,
              on_engine_failure: Callable[[], None] | None = None,
              provenance: Provenance | None = None, start_encoders: bool = False) -> FastAPI:
    """An app serving `engine`. The lifespan starts and shuts down the engine (and the encoder
    processes).

    reference_encoder: enables voice cloning (voice=<registered> and ref_audio); None = 400.
    provenance: signs whole files (audio/provenance.py); None = unsigned.
    on_engine_failure: called if `engine.start()` raises (run_server stops uvicorn with it).
    start_encoders: start the encoder processes with the engine, and count their start-up check
    as part of its start (run_server); otherwise they start at the first compressed response.
    """
    gate = AdmissionGate(engine.deploy.stage0.max_num_seqs + settings.max_queue)
    metrics = ServerMetrics(engine_stats=engine.stats, in_flight=lambda: gate.in_flight,
                            reference_encoder=reference_encoder)
    state = ServerState(engine=engine, settings=settings,
                        voices=VoiceRegistry(settings.voices_dir, engine.sample_rate_hz),
                        metrics=metrics, gate=gate, reference_encoder=reference_encoder,
                        provenance=provenance)
    if state.encode_pool is not None:
        metrics.watch_encoders(state.encode_pool.stats)
    if provenance is not None:
        metrics.watch_certificate(provenance.seconds_to_expiry)
    if state.aligner_pool is not None:
        metrics.watch_aligners(state.aligner_pool.stats)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(_start_engine(state, on_engine_failure, start_encoders))
        try:
            yield
        finally:
            if not starting.done():
                starting.cancel()
            await engine.shutdown()
            if state.encode_pool is not None:
                await state.encode_pool.shutdown()
            state.audio_workers.shutdown()
            state.detect_slots.shutdown()
            state.encode_workers.shutdown()
            if state.aligner_pool is not None:
                await asyncio.to_thread(state.aligner_pool.shutdown)

    app = FastAPI(title="higgs-serve", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible text-to-speech server for Higgs-Audio V3.")
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(SendTimeoutMiddleware, send_timeout_s=settings.send_timeout_s)
    app.add_middleware(BodyLimitMiddleware, default_bytes=settings.max_json_body_bytes,
                       limits={"/v1/audio/voices": MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD_BYTES,
                               watermark.DETECT_PATH: DETECT_MAX_BYTES + MULTIPART_OVERHEAD_BYTES})
    # the key is checked by ApiKeyMiddleware (server/auth.py) for every route but the public
    # ones; the /v1 routes declare the bearer scheme so the OpenAPI document (and /docs'
    # Authorize button) can send it
    protected = [Security(_BEARER)] if settings.api_key else []
    documented = {status: ERROR_RESPONSES[status] for status in (401, 500)
                  if status != 401 or settings.api_key}
    for router in (speech.router, speech_batch.router, voices.router, watermark.router, health.models_router):
        app.include_router(router, dependencies=protected, responses=documented)
    app.include_router(health.router)
    app.include_router(speech_stream.router)
    add_playground(app, settings.playground)
    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)  # outermost: before any body
    return app


async def _start_engine(state: ServerState, on_failure: Callable[[], None] | None,
                        start_encoders: bool) -> None:
    try:
        # the Stage 0 step histogram is fed by the engine loop's per-step hook
        starts = [asyncio.ensure_future(state.engine.start(EngineHooks(on_step=state.metrics.observe_step)))]
        if start_encoders and state.encode_pool is not None:  # while the engine warms up
            starts.append(asyncio.ensure_future(state.encode_pool.start()))
        try:
            await asyncio.gather(*starts)
        except BaseException:  # one failed (or the start was cancelled): stop the other
            for start in starts:
                start.cancel()
            await asyncio.gather(*starts, return_exceptions=True)
            raise
    except asyncio.CancelledError:
        raise
    except Exception as error:  # logged, shown by /health, re-raised by run_server
        logger.exception("the engine (or its encoder processes) failed to start")
        state.engine_start_error = error
        if on_failure is not None:
            on_failure()
        return
    state.engine_started = True
    logger.info("engine ready: serving %s", state.settings.served_model_name)


def run_server(model: str, settings: ServerSettings, deploy: DeployConfig,
               options: RuntimeOptions | None = None,
               reference_encoder: ReferenceEncoder | None = None,
               sockets: list[socket.socket] | None = None,
               provenance: Provenance | None = None) -> None:
    """Serve `model` until SIGINT/SIGTERM; raises the engine's error if it failed to start.

    sockets: already bound listening sockets (the CLI binds before loading, so a port in use
    fails at once); None: uvicorn binds settings.host:settings.port itself."""
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

    app = build_app(engine, settings, reference_encoder=reference_encoder, on_engine_failure=stop,
                    provenance=provenance, start_encoders=True)
    server = draining_server(app, settings.host, settings.port, log_level="info")
    server.run(sockets=sockets)
    error = server_state_of(app).engine_start_error
    if error is not None:
        raise error


SHUTDOWN_ABORT_WINDOW_S = 2  # after the grace period: for aborted requests to answer


def draining_server(app: FastAPI, host: str, port: int, log_level: str) -> uvicorn.Server:
    """uvicorn for `app`, whose shutdown aborts what is left after the grace period; its
    connections capped below the open-file limit, closed lingering after an early answer
    (server/limits/connections.py)."""
    grace_s = server_state_of(app).settings.graceful_shutdown_s
    settings = server_state_of(app).settings
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level=log_level,
                            timeout_graceful_shutdown=grace_s + SHUTDOWN_ABORT_WINDOW_S,
                            ws_max_size=settings.max_ws_message_bytes,
                            http=partial(ServerConnection, cap=server_cap()))
    return DrainingServer(config, server_state_of(app), grace_s)


class DrainingServer(uvicorn.Server):
    """On shutdown, uvicorn stops accepting and waits for in-flight requests; when the grace
    period ends, this aborts their engine requests, so each answers for itself (queued: an
    OpenAI-shaped 503; SSE: a `speech.audio.error` event; raw audio: a truncated body) within
    SHUTDOWN_ABORT_WINDOW_S, before uvicorn's own deadline cancels what is left (whose answer
    would be a plain-text 500)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float):
        super().__init__(config)
        self._state = state
        self._grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        abort_later = asyncio.get_running_loop().call_later(self._grace_s,
                                                            self._state.abort_in_flight)
        try:
            await super().shutdown(sockets)
        finally:
            abort_later.cancel()


def server_state_of(app: FastAPI) -> ServerState:
    return app.state.server

