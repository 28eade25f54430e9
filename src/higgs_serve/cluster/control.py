"""The front end's control plane: a FastAPI app on a private Unix socket, behind the relay.

The relay (cluster/relay/, the data plane) takes every request on the public port; it answers
speech itself and passes everything else here unchanged, after its API-key and body-limit checks
(the key is checked here again, by the same policy: server/auth.py):
the voice endpoints (the single server's router over the fan-out registry, cluster/voice_sync.py),
watermark detection (the single server's router with a CPU detector of its own: detection needs
no engine), /health, /ready, /v1/models, the merged /metrics, the WebSocket relay
(cluster/relay/ws_relay.py) and the playground page (server/routers/playground.py).
Its lifespan starts the replicas and the supervisor (cluster/replicas.py) and stops them.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from higgs_serve.audio.watermark_detect import LazyDetector
from higgs_serve.cluster import metrics_merge
from higgs_serve.cluster.relay import ws_relay
from higgs_serve.cluster.replicas import POLL_TIMEOUT_S, Replica
from higgs_serve.cluster.voice_sync import FanOutRegistry
from higgs_serve.metrics import CONTENT_TYPE
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.server.auth import ApiKeyMiddleware
from higgs_serve.server.limits.detect_slots import DetectSlots
from higgs_serve.server.errors import RETRY_AFTER_S, ApiError, error_response, install_error_handlers
from higgs_serve.server.routers import voices as voices_router
from higgs_serve.server.routers import watermark as watermark_router
from higgs_serve.server.routers.playground import add_playground
from higgs_serve.server.settings import ServerSettings

if TYPE_CHECKING:
    from higgs_serve.cluster.state import Frontend

logger = logging.getLogger(__name__)


def build_control_app(frontend: Frontend) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        supervisor = frontend.supervisor
        supervisor.start_all()  # all at once: the replicas warm up in parallel
        supervising = asyncio.create_task(supervisor.run())
        try:
            yield
        finally:
            supervising.cancel()
            await asyncio.gather(supervising, return_exceptions=True)
            await asyncio.to_thread(supervisor.stop_all)
            await supervisor.aclose()

    app = FastAPI(title="higgs-serve (data parallel)", version="0.1.0", lifespan=lifespan)
    app.state.frontend = frontend
    install_error_handlers(app)
    app.state.server = _VoiceRoutes(frontend.voices, ServerSettings(
        max_input_chars=frontend.settings.max_input_chars), AudioWorkers(2), LazyDetector(),
        DetectSlots(wait_s=frontend.settings.detect_wait_s))
    app.include_router(voices_router.router)  # the key and body limits were checked by the relay
    app.include_router(watermark_router.router)
    _add_health(app, frontend)
    ws_relay.add_websocket(app, frontend)
    add_playground(app, frontend.settings.playground)  # the page's API calls go through the relay
    app.add_middleware(ApiKeyMiddleware, api_key=frontend.settings.api_key)
    return app


@dataclass
class _VoiceRoutes:
    """What the single server's voices and watermark routers read from `app.state.server`: the
    same endpoints, checks and shapes, over the fan-out registry and the front end's own
    detector (on the CPU, loaded at the first detection)."""

    voices: FanOutRegistry
    settings: ServerSettings
    audio_workers: AudioWorkers
    detector: LazyDetector
    detect_slots: DetectSlots  # detections in flight, as the single server's


def no_replica(frontend: Frontend) -> ApiError:
    if not frontend.ready_replicas():
        return ApiError(503, "no engine replica is ready yet; retry shortly", type="server_error",
                        code="not_ready", headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(429, "every engine replica is at capacity; retry later",
                    type="overloaded_error", code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def _add_health(app: FastAPI, frontend: Frontend) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the front end runs; lists each replica (ready, restarts, in flight), never
        its private socket or process id (the route is public: server/auth.py). `ready` is
        checked against the process at this moment: a replica that died is not ready from the
        instant it exited, before the supervisor's next poll."""
        replicas = [{"id": r.id, "ready": r.serving, "restarts": r.restarts,
                     "in_flight": frontend.router.replicas[r.id].in_flight}
                    for r in frontend.replicas.values()]
        return JSONResponse({"status": "ok", "replicas_ready": len(frontend.ready_replicas()),
                             "replicas_total": len(frontend.replicas), "replicas": replicas})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        count = len(frontend.ready_replicas())
        body = {"status": "ready" if count else "starting", "replicas_ready": count,
                "replicas_total": len(frontend.replicas)}
        return JSONResponse(body, status_code=200 if count else 503)

    @app.get("/v1/models")
    async def models() -> Response:
        replicas = frontend.ready_replicas()
        if not replicas:
            return error_response(no_replica(frontend))
        upstream = await frontend.supervisor.clients[replicas[0].id].get("/v1/models")
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        texts = await asyncio.gather(*(_scrape(frontend, r) for r in frontend.replicas.values()))
        scraped = {r.id: text for r, text in zip(frontend.replicas.values(), texts) if text}
        return Response(metrics_merge.render(scraped, frontend), media_type=CONTENT_TYPE)


async def _scrape(frontend: Frontend, replica: Replica) -> str | None:
    if replica.process is None and replica.command is not None:
        return None  # waiting to restart
    try:
        response = await frontend.supervisor.clients[replica.id].get("/metrics",
                                                                     timeout=POLL_TIMEOUT_S)
        return response.text if response.status_code == 200 else None
    except httpx.HTTPError:
        return None
