"""Every error leaves the server in OpenAI's shape, mapped here once:

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

Project exceptions (higgs_serve.errors) map to statuses by type; `ApiError` carries the HTTP-only
cases (401, 404, 409, 413, 503 not ready). Anything unexpected is logged with its traceback and
answered with a generic 500 that never echoes internals.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from higgs_serve.errors import (
    ConflictError,
    EncoderFailedError,
    EngineDeadError,
    EngineOverloadedError,
    InputTooLongError,
    InvalidRequestError,
    OverCapacityError,
    WatermarkUnavailableError,
)
from higgs_serve.server.peer_fields import explain_unknown

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1
SPEECH_PATH = "/v1/audio/speech"  # validation failures there count as outcome "invalid"


class ApiError(Exception):
    """An HTTP error the server answers on purpose (status, OpenAI type/param/code)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


def error_object(message: str, type: str, param: str | None = None,
                 code: str | None = None) -> dict:
    return {"message": message, "type": type, "param": param, "code": code}


def to_api_error(error: Exception) -> ApiError:
    """Map a known exception to its ApiError; unknown exceptions become a generic 500."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, InputTooLongError):
        return ApiError(413, str(error), param=error.param, code="input_too_long")
    if isinstance(error, ConflictError):
        return ApiError(409, str(error), param=error.param, code="conflict")
    if isinstance(error, InvalidRequestError):
        return ApiError(400, str(error), param=error.param)
    if isinstance(error, OverCapacityError):  # before its base class: a 503, not a 429
        return ApiError(503, str(error), type="server_error", code="over_capacity",
                        headers={"Retry-After": str(error.retry_after_s)})
    if isinstance(error, EngineOverloadedError):
        return ApiError(429, str(error) or "the request queue is full; retry later",
                        type="overloaded_error", code="queue_full",
                        headers={"Retry-After": str(error.retry_after_s or RETRY_AFTER_S)})
    if isinstance(error, EngineDeadError):
        return ApiError(503, "the engine has stopped; the server must be restarted",
                        type="server_error", code="engine_dead")
    if isinstance(error, EncoderFailedError):  # the details are in the server's log
        # the server's own failure, not the request's: a 503 the client may retry (a process
        # lost before any byte left was already retried once: server/last_mile/encode_pool.py)
        logger.warning("response encoding failed: %s", error)
        return ApiError(503, "encoding the audio failed on the server; retry the request",
                        type="server_error", code="encoder_failed",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(error, WatermarkUnavailableError):
        return ApiError(503, f"watermark detection is not available on this server: {error}",
                        type="server_error", code="watermark_unavailable")
    logger.error("unhandled error while serving a request", exc_info=error)
    return ApiError(500, "internal server error", type="server_error", code="internal_error")


def error_response(error: ApiError) -> JSONResponse:
    body = {"error": error_object(error.message, error.type, error.param, error.code)}
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def describe_validation_errors(errors: list[dict]) -> tuple[str, str | None]:
    """pydantic/FastAPI error list -> (one readable message, the offending field names)."""
    kinds = {error["type"] for error in errors}
    if "json_invalid" in kinds:
        return "request body is not valid JSON", None
    unknown = [_field_name(error["loc"]) or '""' for error in errors  # "" is a legal JSON key
               if error["type"] == "extra_forbidden"]
    if unknown:
        return explain_unknown(unknown), ",".join(unknown)
    messages, params = [], []
    for error in errors:
        field = _field_name(error["loc"])
        if field is None:
            messages.append(f"request body: {_body_message(error)}")
            continue
        params.append(field)
        text = error["msg"].removeprefix("Value error, ")  # our own validators' messages
        messages.append(f"{field}: {text}")
    return "; ".join(messages), (",".join(params) or None)


def _body_message(error: dict) -> str:
    if error["type"] in ("model_attributes_type", "dict_type", "model_type"):
        return "must be a JSON object"
    return error["msg"]


def _field_name(loc: tuple) -> str | None:
    """('body', 'speed') -> 'speed'; ('body',) -> None."""
    parts = [str(part) for part in loc[1:]] if loc and loc[0] in ("body", "query", "path") \
        else [str(part) for part in loc]
    return ".".join(parts) or None


def _document_400_not_422(app: FastAPI) -> None:
    """FastAPI documents validation failures as 422; this server answers them with 400."""
    build_schema = app.openapi

    def openapi() -> dict:
        schema = build_schema()  # cached by FastAPI after the first call
        for path in schema["paths"].values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        return schema

    app.openapi = openapi


def install_error_handlers(app: FastAPI) -> None:
    _document_400_not_422(app)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(error.errors()))
        if request.url.path == SPEECH_PATH:
            request.app.state.server.metrics.count("invalid")
            if "json" not in request.headers.get("content-type", ""):
                message = "the request body must be JSON (Content-Type: application/json)"
                param = None
        return error_response(ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return error_response(ApiError(error.status_code, str(error.detail), type=kind,
                                       headers=error.headers))

    @app.exception_handler(ApiError)
    async def _api(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(InvalidRequestError)
    @app.exception_handler(EngineOverloadedError)
    @app.exception_handler(EngineDeadError)
    @app.exception_handler(WatermarkUnavailableError)
    @app.exception_handler(EncoderFailedError)
    async def _engine(request: Request, error: Exception) -> JSONResponse:
        return error_response(to_api_error(error))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        return error_response(to_api_error(error))
