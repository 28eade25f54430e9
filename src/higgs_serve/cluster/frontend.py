"""The public API process in front of N engine replicas on one host.

Speech requests (single and batch) are routed by cluster/routing.py and relayed byte for byte:
the upstream body is passed on as it arrives (raw audio, SSE, files), so streaming keeps its
latency. A client that hangs up closes the upstream connection, which the replica's server turns
into an engine abort.
A request is tried on another replica only before its first byte (refused connection, 429, 503);
once every replica is full the client gets 429 with Retry-After. The WebSocket endpoint is relayed
frame by frame, one replica per session. Voices go through the canonical registry
(cluster/voice_sync.py). /metrics is every replica's metrics with a `replica` label, plus the
router's own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from contextlib import asynccontextmanager
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from higgs_serve.audio.watermark_detect import LazyDetector
from higgs_serve.cluster import metrics_merge, ws_relay
from higgs_serve.cluster.replicas import Replica, Supervisor
from higgs_serve.cluster.routing import Router, batch_routing_key, body_key, routing_key
from higgs_serve.cluster.voice_sync import FanOutRegistry, reconcile, stored_audio, upload_fields
from higgs_serve.metrics import CONTENT_TYPE
from higgs_serve.server.errors import RETRY_AFTER_S, ApiError, error_response, install_error_handlers
from higgs_serve.server.audio_workers import AudioWorkers
from higgs_serve.server.routers import voices as voices_router
from higgs_serve.server.routers import watermark as watermark_router
from higgs_serve.server.settings import DEFAULT_MAX_INPUT_CHARS, ServerSettings
from higgs_serve.server.speech_run import CLIENT_GONE, unless_disconnected

logger = logging.getLogger(__name__)
# Not passed on either way: they describe one hop, not the message.
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "host",
                          "content-length", "date", "server", "te", "trailer",
                          "proxy-authorization", "proxy-authenticate", "authorization"})


@dataclass(frozen=True)
class FrontendSettings:
    api_key: str | None = None
    graceful_shutdown_s: int = 30
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS  # also bounds a voice's ref_text


class Frontend:
    """Router + replicas + canonical voices: what the endpoints share."""

    def __init__(self, replicas: dict[str, Replica], router: Router, voices_dir: Path,
                 sample_rate_hz: int, settings: FrontendSettings, poll_interval_s: float = 0.5):
        self.replicas = replicas
        self.router = router
        self.voices = FanOutRegistry(voices_dir, sample_rate_hz, voice_fan_out(self))
        self.settings = settings
        self.poll_interval_s = poll_interval_s
        self.client: httpx.AsyncClient | None = None
        self.supervisor: Supervisor | None = None

    async def sync_voices(self, replica: Replica) -> None:
        async def audio(name: str) -> bytes:
            return stored_audio(self.voices, name)

        # everything again: the replica may have missed a replacement while it was away
        await reconcile(self.client, replica.url, {v.name: v for v in self.voices.list()}, audio,
                        push_all=True)

    def ready_replicas(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.ready]


def build_frontend(frontend: Frontend) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        frontend.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0),
                                            limits=httpx.Limits(max_connections=None,
                                                                max_keepalive_connections=64))
        frontend.supervisor = Supervisor(frontend.replicas, frontend.router, frontend.client,
                                         frontend.sync_voices, frontend.poll_interval_s)
        frontend.supervisor.start_all()  # all at once: the replicas warm up in parallel
        supervising = asyncio.create_task(frontend.supervisor.run())
        try:
            yield
        finally:
            supervising.cancel()
            await asyncio.to_thread(frontend.supervisor.stop_all)
            await frontend.client.aclose()

    app = FastAPI(title="higgs-serve (data parallel)", version="0.1.0", lifespan=lifespan)
    app.state.frontend = frontend
    install_error_handlers(app)
    protected = [Depends(_api_key_checker(frontend.settings.api_key))]
    _add_speech(app, frontend, protected)
    app.state.server = _VoiceRoutes(frontend.voices, ServerSettings(
        max_input_chars=frontend.settings.max_input_chars), AudioWorkers(2), LazyDetector())
    app.include_router(voices_router.router, dependencies=protected)
    # detection needs no replica: the front end answers it itself, as the single server does
    app.include_router(watermark_router.router, dependencies=protected)
    _add_health(app, frontend, protected)
    ws_relay.add_websocket(app, frontend)
    return app


# ----------------------------------------------------------------------------- speech
def _add_speech(app: FastAPI, frontend: Frontend, protected: list) -> None:
    @app.post("/v1/audio/speech", dependencies=protected)
    async def speech(request: Request) -> Response:
        return await _relay_post(frontend, request, routing_key)

    # The whole batch goes to one replica, which runs its items concurrently (at most
    # max_num_seqs at a time) and answers once, so the rules above hold unchanged: retried only
    # before the answer's first byte, which for a batch is after its last item.
    @app.post("/v1/audio/speech/batch", dependencies=protected)
    async def speech_batch(request: Request) -> Response:
        return await _relay_post(frontend, request, batch_routing_key)


async def _relay_post(frontend: Frontend, request: Request,
                      key_of: Callable[[dict], str | None]) -> Response:
    """Route the request's JSON body by `key_of(body)` and relay it to the same path on the
    chosen replica."""
    body = await request.body()
    key = body_key(body, key_of)
    headers = forward_headers(request.headers)
    upstream = await unless_disconnected(
        _send(frontend, key, request.url.path, body, headers), request)
    if upstream is CLIENT_GONE:
        return Response(status_code=499)
    response, replica_id = upstream
    out_headers = response_headers(response.headers)
    if response.status_code != 200:  # an error: small, read whole
        content = await response.aread()
        await response.aclose()
        frontend.router.finished(replica_id)
        return Response(content, status_code=response.status_code, headers=out_headers)
    return StreamingResponse(_relay(frontend, response, replica_id), status_code=200,
                             headers=out_headers)


async def _send(frontend: Frontend, key: str | None, path: str, body: bytes,
                headers: dict[str, str]) -> tuple[httpx.Response, str]:
    """Send to the routed replica; before any byte came back, try another on a refused
    connection, 429 or 503. Returns the response (headers read, body not) and its replica."""
    tried: list[str] = []
    last: httpx.Response | None = None
    while True:
        decision = frontend.router.choose(key, exclude=tried)
        if decision is None:
            if last is not None:  # every replica said 429/503: pass the last answer on
                return last, tried[-1]
            raise _no_replica(frontend)
        replica = frontend.replicas[decision.replica]
        frontend.router.dispatched(replica.id)
        request = frontend.client.build_request("POST", f"{replica.url}{path}",
                                                content=body, headers=headers)
        try:
            response = await frontend.client.send(request, stream=True)
        except httpx.TransportError:
            frontend.router.finished(replica.id)
            frontend.supervisor.mark_down(replica)
            status = None
        except BaseException:
            frontend.router.finished(replica.id)
            raise
        else:
            status = response.status_code
            if not frontend.router.may_retry(first_byte_sent=False, status=status):
                return response, replica.id
            if last is not None:
                await last.aclose()
            await response.aread()
            last = response
            frontend.router.finished(replica.id)
        tried.append(replica.id)
        frontend.router.count_retry()


def _no_replica(frontend: Frontend) -> ApiError:
    if not frontend.ready_replicas():
        return ApiError(503, "no engine replica is ready yet; retry shortly", type="server_error",
                        code="not_ready", headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(429, "every engine replica is at capacity; retry later",
                    type="overloaded_error", code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


async def _relay(frontend: Frontend, response: httpx.Response, replica_id: str):
    """The upstream body as it arrives. Cancelled when the client leaves: closing the upstream
    response then closes its connection, and the replica aborts the engine request."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()
        frontend.router.finished(replica_id)


def forward_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    kept = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
    if "content-length" in headers:  # the body is relayed unchanged, so its length holds
        kept["content-length"] = headers["content-length"]
    return kept


# ----------------------------------------------------------------------------- voices
@dataclass
class _VoiceRoutes:
    """What the single server's voices and watermark routers read from `app.state.server`: the
    same endpoints, checks and shapes, over the fan-out registry and the front end's own detector."""

    voices: FanOutRegistry
    settings: ServerSettings
    audio_workers: AudioWorkers
    detector: LazyDetector


def voice_fan_out(frontend: Frontend) -> Callable[[str, object], None]:
    """The registry's on_change: apply an add/delete on every ready replica (sync, in the
    registry's worker thread). A replica that misses it is marked for a full resync, done by the
    supervisor before it serves again."""
    def apply(kind: str, subject) -> None:
        ready = frontend.ready_replicas()
        for replica in frontend.replicas.values():
            if replica not in ready:
                replica.voices_synced = False
        if kind == "add":
            audio = stored_audio(frontend.voices, subject.name)
        for replica in ready:
            try:
                with httpx.Client(timeout=120) as client:
                    if kind == "add":
                        client.post(f"{replica.url}/v1/audio/voices", data=upload_fields(subject),
                                    files={"audio_sample": ("audio.wav", audio, "audio/wav")}
                                    ).raise_for_status()
                    else:
                        response = client.delete(f"{replica.url}/v1/audio/voices/{subject}")
                        if response.status_code != 404:
                            response.raise_for_status()
            except httpx.HTTPError:
                logger.warning("voice %s on replica %s failed; it resyncs before serving again",
                               kind, replica.id, exc_info=True)
                replica.voices_synced = False
                replica.ready = False
                frontend.router.set_healthy(replica.id, False)
    return apply


# ----------------------------------------------------------------------------- health, metrics
def _add_health(app: FastAPI, frontend: Frontend, protected: list) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the front end runs; lists each replica (ready, restarts, pid, in flight)."""
        replicas = [{"id": r.id, "url": r.url, "ready": r.ready, "restarts": r.restarts,
                     "pid": r.process.pid if r.process is not None else None,
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

    @app.get("/v1/models", dependencies=protected)
    async def models() -> Response:
        replicas = frontend.ready_replicas()
        if not replicas:
            return error_response(_no_replica(frontend))
        upstream = await frontend.client.get(f"{replicas[0].url}/v1/models")
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        texts = await asyncio.gather(*(_scrape(frontend, r) for r in frontend.replicas.values()))
        scraped = {r.id: text for r, text in zip(frontend.replicas.values(), texts) if text}
        return Response(metrics_merge.render(scraped, frontend), media_type=CONTENT_TYPE)


async def _scrape(frontend: Frontend, replica: Replica) -> str | None:
    if not replica.url:
        return None
    try:
        response = await frontend.client.get(f"{replica.url}/metrics", timeout=2.0)
        return response.text if response.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _api_key_checker(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
    return check
