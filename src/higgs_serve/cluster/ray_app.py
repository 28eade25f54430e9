"""Ray Serve application: engine replicas (one engine on one GPU each) behind the OpenAI API.

Deployments:
- `HiggsEngine`: each replica starts the unchanged single-GPU server on 127.0.0.1 inside its Ray
  actor (Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU, `ray_actor_options: {num_gpus: 1}`)
  and relays requests to it. Health is the server's /ready; routing stats are its in-flight count
  and KV usage; Ray's graceful shutdown lets a replica being removed finish its in-flight
  requests before the server is stopped.
- `VoiceStore`: the canonical registered voices (one replica). An engine replica brings its own
  server's voices up to date whenever the store's version moved, before a request that names a
  voice (voices it lacks or that were replaced since, by each voice's revision), so a voice
  registered once is usable on every replica, also one started later.
- `HiggsIngress`: the FastAPI ingress (speech, speech batch, watermark detection, voices, models,
  health). It computes the request's affinity key (cluster/routing.py) and passes it as the
  handle's multiplexed model id, which `VoiceAffinityRouter` (cluster/ray_router.py) reads.

Build with `build_app({...})` (also the `import_path` of a `serve run` / `serve deploy` config).
No `from __future__ import annotations` here: Serve's class ingress re-reads the endpoints'
annotations, and string annotations turn `request: Request` into a query parameter.
"""


import asyncio
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from higgs_serve.cluster.replicas import Replica, parse_load
from higgs_serve.cluster.routing import (
    DEFAULT_LOAD_BOUND,
    RETRYABLE_STATUS,
    batch_routing_key,
    body_key,
    routing_key,
)
from higgs_serve.cluster.voice_sync import reconcile, stored_audio_or_none, voice_json
from higgs_serve.errors import ConflictError, HiggsServeError, InvalidRequestError
from higgs_serve.server import auth
from higgs_serve.server.errors import RETRY_AFTER_S, ApiError, error_response, install_error_handlers
from higgs_serve.server.routers.voices import read_upload, voice_exists, voice_missing
from higgs_serve.server.routers.watermark import DETECT_PATH
from higgs_serve.voices.registry import Voice, VoiceRegistry

logger = logging.getLogger(__name__)
# Not passed on either way: they describe one hop, not the message.
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "host",
                          "content-length", "date", "server", "te", "trailer",
                          "proxy-authorization", "proxy-authenticate", "authorization"})
_ATTEMPTS = 3  # tries of a speech request before its first byte (the router picks each time)


# ----------------------------------------------------------------------------- voices
@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class VoiceStore:
    """The registered voices of the application; `version` moves on every change."""

    def __init__(self, voices_dir: str | None = None, sample_rate_hz: int = 24000):
        self.registry = VoiceRegistry(voices_dir or tempfile.mkdtemp(prefix="higgs-voices-"),
                                      sample_rate_hz)
        self.version = 0
        self.revisions: dict[str, int] = {}  # name -> the version that last set it

    def get_version(self) -> int:
        return self.version

    def list(self) -> list[Voice]:
        return self.registry.list()

    def snapshot(self) -> "tuple[int, list[Voice], dict[str, int]]":  # `list` is a method here
        return self.version, self.registry.list(), dict(self.revisions)

    def add(self, name: str, data: bytes, ref_text: str | None, consent: str | None = None,
            speaker_description: str | None = None, overwrite: bool = False) -> dict:
        """{"voice": json} or {"error": message, "status", "param", "code"}: errors travel as
        data."""
        try:
            if not overwrite and self.registry.get(name) is not None:  # 409 before decoding
                raise voice_exists(name)
            voice, replaced = self.registry.register(name, data, ref_text, consent=consent,
                                                     speaker_description=speaker_description,
                                                     overwrite=overwrite)
        except ApiError as error:
            return {"error": error.message, "status": error.status, "param": "name",
                    "code": error.code}
        except ConflictError as error:  # another upload of the name won the race
            return {"error": str(error), "status": 409, "param": "name", "code": "voice_exists"}
        except InvalidRequestError as error:
            return {"error": str(error), "status": 400, "param": error.param}
        self.version += 1
        self.revisions[name] = self.version
        return {"voice": {**voice_json(voice), "replaced": replaced}}

    def delete(self, name: str) -> bool:
        deleted = self.registry.delete(name)
        self.version += deleted
        self.revisions.pop(name, None)
        return deleted

    def audio(self, name: str) -> bytes | None:
        return stored_audio_or_none(self.registry, name)  # None: deleted meanwhile


# ----------------------------------------------------------------------------- engine replicas
@serve.deployment(max_ongoing_requests=64, graceful_shutdown_timeout_s=120,
                  health_check_period_s=5, ray_actor_options={"num_gpus": 1})
class HiggsEngine:
    """One engine server on this actor's device, relayed."""

    def __init__(self, model: str, voices: DeploymentHandle, device: str = "cuda",
                 serve_args: list[str] | None = None, start_timeout_s: float = 900.0):
        self.work = Path(tempfile.mkdtemp(prefix="higgs-ray-replica-"))
        args = list(serve_args or [])

        def command(socket_path: Path) -> list[str]:
            return [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve",
                    model, "--uds", str(socket_path), "--device", device,
                    "--voices-dir", str(self.work / "voices"), *args]

        # on a Unix socket in this actor's private work directory: reached only through Serve
        self.server = Replica(id="local", socket_path=self.work / "server.sock", command=command,
                              log_path=self.work / "server.log")
        self.server.start()
        self._wait_ready(start_timeout_s)
        self.voices = voices
        self.voices_version = -1
        self.voices_pushed: dict[str, int] = {}  # name -> the store revision this server holds
        self.voices_lock = asyncio.Lock()
        self.client = self.server.client(timeout=httpx.Timeout(None, connect=5.0))
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.server.sync_client(timeout=2) as client:
            while time.monotonic() < deadline:
                if self.server.exited:
                    raise RuntimeError(f"the engine server exited:\n{self._log_tail()}")
                try:
                    if client.get("/ready").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"the engine server was not ready in {timeout_s} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        return (self.work / "server.log").read_text(errors="replace")[-4000:]

    async def _sync_voices(self) -> None:
        version = await self.voices.get_version.remote()
        if version == self.voices_version:
            return
        async with self.voices_lock:
            if version == self.voices_version:
                return
            version, listed, revisions = await self.voices.snapshot.remote()
            replaced = {name for name, revision in revisions.items()
                        if self.voices_pushed.get(name) != revision}

            async def audio(name: str) -> bytes:
                return await self.voices.audio.remote(name)

            await reconcile(self.client, "", {v.name: v for v in listed}, audio,
                            again=replaced)
            self.voices_pushed = revisions
            self.voices_version = version

    async def speech(self, body: bytes, headers: dict[str, str], uses_voice: bool,
                     path: str = "/v1/audio/speech"):
        """POST `path` (speech or speech/batch) to the server. Yields {"status", "headers"}
        first, then the body's bytes as they come."""
        if uses_voice:
            await self._sync_voices()
        request = self.client.build_request("POST", path,
                                            content=body, headers=headers)
        response = await self.client.send(request, stream=True)
        try:  # cancelled when the client leaves: closing the connection aborts the engine request
            headers = {**response_headers(response.headers), "X-Higgs-Replica": self.replica_id}
            yield {"status": response.status_code, "headers": headers}
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    async def models(self) -> bytes:
        return (await self.client.get("/v1/models")).content

    async def check_health(self) -> None:
        if self.server.exited:
            raise RuntimeError("the engine server process exited")
        response = await self.client.get("/ready", timeout=5)
        if response.status_code != 200:
            raise RuntimeError(f"the engine server is not ready: {response.text}")

    async def record_routing_stats(self) -> dict[str, float]:
        response = await self.client.get("/metrics", timeout=5)
        in_flight, kv_usage = parse_load(response.text)
        return {"in_flight": in_flight, "kv_usage": kv_usage}

    def __del__(self) -> None:
        # Ray has already let in-flight requests finish (graceful_shutdown_timeout_s)
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()
        shutil.rmtree(getattr(self, "work", ""), ignore_errors=True)


def forward_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    kept = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
    if "content-length" in headers:  # the body is relayed unchanged, so its length holds
        kept["content-length"] = headers["content-length"]
    return kept


# ----------------------------------------------------------------------------- ingress
api = FastAPI(title="higgs-serve (Ray Serve)", version="0.1.0")
install_error_handlers(api)


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class HiggsIngress:
    def __init__(self, engine: DeploymentHandle, voices: DeploymentHandle,
                 api_key: str | None = None):
        self.engine = engine
        self.voices = voices
        self.api_key = api_key

    def _check_key(self, request: Request) -> None:
        """The single server's key rule (server/auth.py), on each /v1 route of this ingress."""
        if self.api_key is None:
            return
        if not auth.bearer_ok(request.headers.get("authorization", "").encode("latin-1"),
                              self.api_key.encode()):
            raise auth.unauthorized()

    @api.post("/v1/audio/speech")
    async def speech(self, request: Request) -> Response:
        return await self._relay(request, routing_key)

    @api.post("/v1/audio/speech/batch")
    async def speech_batch(self, request: Request) -> Response:
        """The whole batch to one engine replica, as in the one-host front end."""
        return await self._relay(request, batch_routing_key)

    @api.post(DETECT_PATH)
    async def watermark_detect(self, request: Request) -> Response:
        """To an engine replica, whose server detects (and checks the upload); routed by load."""
        return await self._relay(request, lambda _: None)

    async def _relay(self, request: Request, key_of) -> Response:
        self._check_key(request)
        body = await request.body()
        key = body_key(body, key_of)
        stream, meta = await self._first_byte(body, forward_headers(request.headers), key,
                                              request.url.path)
        if meta["status"] != 200:
            content = b"".join([chunk async for chunk in stream])
            return Response(content, status_code=meta["status"], headers=meta["headers"])
        return StreamingResponse(stream, status_code=200, headers=meta["headers"])

    async def _first_byte(self, body: bytes, headers: dict, key: str | None, path: str):
        """Send, and try again (the router picks again) on a 429/503 or a lost replica, only
        until the response's status and headers came back."""
        handle = self.engine.options(stream=True, multiplexed_model_id=key or "")
        # a batch's items may name voices its key does not: its replica syncs them regardless
        uses_voice = (key or "").startswith("voice:") or path.endswith("/batch")
        for attempt in range(_ATTEMPTS):
            stream = handle.speech.remote(body, headers, uses_voice, path)
            try:
                meta = await stream.__anext__()
            except (HiggsServeError, ApiError):
                raise
            except BackPressureError:  # every replica's queue (max_queued_requests) is full
                raise ApiError(429, "every engine replica is at capacity; retry later",
                               type="overloaded_error", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)}) from None
            except Exception:  # the replica died or was removed before answering
                if attempt + 1 == _ATTEMPTS:
                    raise ApiError(503, "no engine replica answered; retry shortly",
                                   type="server_error", code="not_ready",
                                   headers={"Retry-After": str(RETRY_AFTER_S)}) from None
                continue
            if meta["status"] not in RETRYABLE_STATUS or attempt + 1 == _ATTEMPTS:
                return stream, meta
            stream.cancel()
        raise AssertionError("unreachable")

    @api.get("/v1/audio/voices")
    async def list_voices(self, request: Request) -> JSONResponse:
        self._check_key(request)
        voices = [voice_json(v) for v in await self.voices.list.remote()]
        return JSONResponse({"object": "list", "data": voices,  # the single server's list shape
                             "voices": [v["name"] for v in voices], "uploaded_voices": voices})

    @api.post("/v1/audio/voices")
    async def create_voice(self, request: Request, audio_sample: Annotated[UploadFile, File()],
                           name: Annotated[str, Form()],
                           ref_text: Annotated[str | None, Form()] = None,
                           consent: Annotated[str | None, Form()] = None,
                           speaker_description: Annotated[str | None, Form()] = None,
                           overwrite: Annotated[bool, Form()] = False) -> JSONResponse:
        self._check_key(request)
        data = await read_upload((await request.form()).keys(), name, audio_sample)
        result = await self.voices.add.remote(name, data, ref_text, consent, speaker_description,
                                              overwrite)
        if "error" in result:
            raise ApiError(result["status"], result["error"], param=result.get("param", "name"),
                           code=result.get("code"))
        return JSONResponse(result["voice"])

    @api.delete("/v1/audio/voices/{name}")
    async def delete_voice(self, name: str, request: Request) -> JSONResponse:
        self._check_key(request)
        if not await self.voices.delete.remote(name):
            raise voice_missing(name)
        return JSONResponse({"object": "voice.deleted", "name": name, "deleted": True})

    @api.get("/v1/models")
    async def models(self, request: Request) -> Response:
        self._check_key(request)
        return Response(await self.engine.models.remote(), media_type="application/json")

    @api.get("/health")
    async def health(self) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @api.get("/ready")
    async def ready(self) -> Response:
        """Serve routes traffic only to replicas whose constructor finished (server ready)."""
        try:
            await asyncio.wait_for(self.engine.models.remote(), timeout=5)
        except Exception:
            return error_response(ApiError(503, "no engine replica is ready", type="server_error",
                                           code="not_ready"))
        return JSONResponse({"status": "ready"})


# ----------------------------------------------------------------------------- application
@dataclass(frozen=True)
class RayAppArgs:
    """The application's arguments (`args:` in a Serve config file). Unknown keys are refused."""

    model: str
    device: str = "cuda"                  # "cpu" for CPU replicas (tests, laptops)
    serve_args: list[str] = field(default_factory=list)  # more `higgs-serve serve` flags
    voices_dir: str | None = None         # the VoiceStore's directory (None: a temp dir)
    api_key: str | None = None
    routing: str = "affinity"             # or "least-loaded"
    load_bound: float = DEFAULT_LOAD_BOUND
    # HiggsEngine deployment options (num_replicas, autoscaling_config, max_ongoing_requests,
    # ray_actor_options, ...), the same keys as a config file's `deployments:` entry
    engine_options: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, args: dict) -> "RayAppArgs":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown higgs-serve Ray app argument(s) {unknown}; known: {sorted(known)}")
        if "model" not in args:
            raise ValueError("the higgs-serve Ray app needs `model` (a model directory or hub id)")
        parsed = cls(**args)
        if parsed.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be cuda or cpu, got {parsed.device!r}")
        return parsed


def build_app(args: dict):
    """The Serve application; `serve run higgs_serve.cluster.ray_app:build_app model=...` or a
    config file's `import_path`. Deployment options (replicas, autoscaling, GPUs) come from the
    config file's `deployments:` section, which overrides the defaults set here."""
    parsed = RayAppArgs.parse(dict(args))
    router_config = {"request_router_class": "higgs_serve.cluster.ray_router:VoiceAffinityRouter",
                     "request_router_kwargs": {"policy": parsed.routing,
                                               "load_bound": parsed.load_bound},
                     "request_routing_stats_period_s": 1.0}
    engine_options: dict[str, Any] = {"request_router_config": router_config}
    if parsed.device == "cpu":
        engine_options["ray_actor_options"] = {"num_cpus": 1, "num_gpus": 0}
    engine_options.update(parsed.engine_options)
    voices = VoiceStore.bind(parsed.voices_dir)
    engine = HiggsEngine.options(**engine_options).bind(parsed.model, voices, parsed.device,
                                                        parsed.serve_args)
    return HiggsIngress.bind(engine, voices, parsed.api_key)
