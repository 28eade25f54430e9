"""POST /v1/audio/speech/batch (vllm-omni's shape): 1-32 items, each a non-streamed speech request.

The envelope's speech fields are defaults; an item's own fields (non-null) override them. The
envelope is validated as a whole (a malformed batch is a 400); each item is then validated,
admitted, planned and generated on its own, concurrently, through the same engine and admission
gate as single requests, at most `max_num_seqs` of one batch at a time. Whatever goes wrong with
one item (bad field, bad reference, queue full, engine error) becomes that item's error result;
the batch itself answers 200 with `results` in item order and `total`/`succeeded`/`failed`.
A client that disconnects abandons the batch: every item in flight is aborted.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from higgs_serve.audio import formats
from higgs_serve.errors import InvalidRequestError
from higgs_serve.server import speech_run
from higgs_serve.server.errors import describe_validation_errors, to_api_error
from higgs_serve.server.routers.speech import check_engine
from higgs_serve.server.schemas import (
    ERROR_RESPONSES,
    BatchItemResult,
    SpeechBatchRequest,
    SpeechBatchResponse,
    SpeechRequestBody,
    Usage,
)
from higgs_serve.server.state import ServerState, server_state

router = APIRouter(tags=["audio"])
_STREAM_FIELDS = ("stream", "stream_format")


@router.post("/v1/audio/speech/batch", response_model=SpeechBatchResponse,
             responses=ERROR_RESPONSES)
async def create_speech_batch(body: SpeechBatchRequest, request: Request) -> Response:
    arrived_s = time.perf_counter()
    state = server_state(request)
    check_engine(state)
    defaults = body.model_dump(exclude_unset=True, exclude={"items"})
    slots = asyncio.Semaphore(state.engine.deploy.stage0.max_num_seqs)
    work = asyncio.gather(*(_run_item(index, item, defaults, state, arrived_s, slots)
                            for index, item in enumerate(body.items)))
    results = await speech_run.unless_disconnected(work, request)
    if results is speech_run.CLIENT_GONE:
        return Response(status_code=499)
    results, signed = zip(*results)
    succeeded = sum(result.status == "success" for result in results)
    answer = SpeechBatchResponse(id=f"speech-batch-{uuid.uuid4().hex}", results=list(results),
                                 total=len(results), succeeded=succeeded,
                                 failed=len(results) - succeeded)
    # on a signing server, the claim header when an item's file carries no manifest
    unsigned = any(result.status == "success" and not is_signed for result, is_signed in zip(results, signed))
    return Response(answer.model_dump_json(), media_type="application/json",
                    headers=speech_run.claim_headers(state) if unsigned else None)


async def _run_item(index: int, item: dict[str, Any], defaults: dict[str, Any],
                    state: ServerState, arrived_s: float,
                    slots: asyncio.Semaphore) -> tuple[BatchItemResult, bool]:
    """One item, start to finish, and whether its file is signed; every failure becomes its
    error result."""
    try:
        body = _item_body(item, defaults)
        async with slots:
            return await _generate(index, body, state, arrived_s)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001: each item answers for itself
        api_error = to_api_error(error)
        return BatchItemResult(index=index, status="error", error=api_error.message,
                               param=api_error.param, code=api_error.code,
                               status_code=api_error.status), False


def _item_body(item: dict[str, Any], defaults: dict[str, Any]) -> SpeechRequestBody:
    """Defaults overridden by the item's non-null fields -> a validated, non-streamed request."""
    streamed = [name for name in _STREAM_FIELDS if item.get(name) is not None]
    if streamed:
        raise InvalidRequestError(
            f"batch items are answered as files, not streamed: drop {', '.join(streamed)}",
            param=streamed[0])
    merged = {**defaults, **{key: value for key, value in item.items() if value is not None},
              "stream": False}  # a file, as /speech answers the same body with stream: false
    try:
        return SpeechRequestBody.model_validate(merged)
    except ValidationError as error:
        message, param = describe_validation_errors(list(error.errors()))
        raise InvalidRequestError(message, param=param) from error


async def _generate(index: int, body: SpeechRequestBody, state: ServerState,
                    arrived_s: float) -> tuple[BatchItemResult, bool]:
    generation = await speech_run.admit(body, state, arrived_s)
    plan = generation.plan
    await speech_run.start(generation, state)
    try:
        audio = await generation.collect()
        if generation.finish_reason == "abort":  # cut by the shutdown's grace period
            generation.close()
            raise speech_run.shutting_down()
        data, signed = await speech_run.render_file(audio, plan, state)
    except asyncio.CancelledError:
        generation.close()  # unfinished: aborted in the engine, counted "abort"
        raise
    except BaseException:
        generation.close(outcome="error")
        raise
    generation.close()
    usage = Usage(input_tokens=plan.input_tokens, output_tokens=generation.num_frames,
                  total_tokens=plan.input_tokens + generation.num_frames)
    return BatchItemResult(index=index, status="success",
                           audio_data=base64.b64encode(data).decode("ascii"),
                           media_type=formats.MEDIA_TYPES[plan.response_format],
                           sample_rate=plan.sample_rate_hz,
                           finish_reason=generation.finish_reason, usage=usage), signed
