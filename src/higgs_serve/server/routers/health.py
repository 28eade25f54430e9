"""GET /v1/models, /health, /ready, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from higgs_serve.metrics import CONTENT_TYPE
from higgs_serve.server.schemas import ModelList, ModelObject
from higgs_serve.server.state import server_state

router = APIRouter()
models_router = APIRouter()  # under /v1: behind the API key, unlike health and metrics


@models_router.get("/v1/models", response_model=ModelList, tags=["models"])
async def list_models(request: Request) -> ModelList:
    state = server_state(request)
    return ModelList(data=[ModelObject(id=name, created=state.created_at, owned_by="higgs-serve")
                           for name in state.settings.served_model_names])


@router.get("/health", tags=["health"])
async def health(request: Request) -> JSONResponse:
    """200 while the process can serve (also during warm-up); 503 once the engine is dead."""
    state = server_state(request)
    if state.engine_dead():
        return JSONResponse({"status": "dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", tags=["health"])
async def ready(request: Request) -> JSONResponse:
    """200 once warm-up and graph capture have finished and the engine is alive; else 503."""
    state = server_state(request)
    if state.engine_dead():
        return JSONResponse({"status": "dead"}, status_code=503)
    if not state.engine_ready():
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", tags=["health"], response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text exposition format"}})
async def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE)
