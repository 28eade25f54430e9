"""POST /v1/audio/speech: one encoded file, raw chunked pcm/wav, or SSE events.

Order of work: validate the body's schema, refuse at once if the engine is dead or warming up
(before any reference clip is fetched, decoded or encoded), build the plan (speech_plan), admit
(bounded in-flight count, 429 past it), submit and wait for the first chunk; only then does a
response start. After that point
a failure ends a raw stream abruptly (the client sees a truncated body) or becomes a
`speech.audio.error` event. A client that disconnects cancels the response, which aborts the
engine request through `Generation.close`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from higgs_serve.audio import formats
from higgs_serve.audio.time_stretch import time_stretch
from higgs_serve.errors import (
    EngineDeadError,
    EngineOverloadedError,
    HiggsServeError,
    InvalidRequestError,
)
from higgs_serve.server import long_form, sse
from higgs_serve.server.errors import RETRY_AFTER_S, ApiError, error_object, to_api_error
from higgs_serve.server.generation import Generation
from higgs_serve.server.schemas import ERROR_RESPONSES, SpeechRequestBody
from higgs_serve.server.speech_plan import SpeechPlan, build_plan
from higgs_serve.server.state import ServerState, server_state

logger = logging.getLogger(__name__)
T = TypeVar("T")
router = APIRouter(tags=["audio"])

_AUDIO_CONTENT = {media: {"schema": {"type": "string", "format": "binary"}}
                  for media in sorted(set(formats.MEDIA_TYPES.values()))}
_AUDIO_CONTENT[sse.MEDIA_TYPE] = {"schema": {"type": "string"}}


@router.post("/v1/audio/speech", response_class=Response,
             responses={200: {"description": "Audio or an event stream", "content": _AUDIO_CONTENT},
                        **ERROR_RESPONSES})
async def create_speech(body: SpeechRequestBody, request: Request) -> Response:
    arrived_s = time.perf_counter()
    state = server_state(request)
    _check_engine(state)
    try:
        plan = await build_plan(body, state)
    except (ApiError, InvalidRequestError):
        state.metrics.count("invalid")
        raise
    segments = long_form.plan_segments(body.input, state.settings)
    if len(segments) > 1:  # split and spoken as one recording (server/long_form.py)
        return await long_form.create_long_form(plan, segments, request, state, arrived_s)
    if not state.gate.try_acquire():
        state.metrics.count("rejected")
        raise EngineOverloadedError(f"the server is at capacity ({state.gate.capacity} requests "
                                    "in flight); retry later")  # 429 + Retry-After (errors.py)
    generation = Generation(state, plan, arrived_s)
    try:
        if await _unless_disconnected(generation.start(), request) is _CLIENT_GONE:
            state.metrics.count("abort")  # left while queued: start() was cancelled, slot freed
            return Response(status_code=499)
    except EngineOverloadedError:
        state.metrics.count("rejected")
        raise
    except InvalidRequestError:
        state.metrics.count("invalid")
        raise
    except BaseException:
        state.metrics.count("error")
        raise
    if plan.mode == "file":
        return await _file_response(generation, request, state)
    # the server's own share of the time to first audio, as OpenAI reports its processing time:
    # beside the client's own TTFA it tells time in the server from time on the way to it
    headers = {**_stream_headers(plan, state), "Cache-Control": "no-cache",
               "X-Time-To-First-Audio-Ms": f"{1e3 * (time.perf_counter() - arrived_s):.1f}"}
    if plan.mode == "sse":
        return StreamingResponse(_sse_events(generation, state), media_type=sse.MEDIA_TYPE,
                                 headers={**headers, "X-Accel-Buffering": "no"},
                                 background=BackgroundTask(generation.close))
    return StreamingResponse(_raw_audio(generation, state),
                             media_type=formats.MEDIA_TYPES[plan.response_format],
                             headers=headers, background=BackgroundTask(generation.close))


def _check_engine(state: ServerState) -> None:
    if state.engine_dead():
        raise EngineDeadError()  # 503 engine_dead (errors.py)
    if not state.engine_ready():
        raise ApiError(503, "the engine is still warming up; retry shortly",
                       type="server_error", code="not_ready",
                       headers={"Retry-After": str(RETRY_AFTER_S)})


def _stream_headers(plan: SpeechPlan, state: ServerState) -> dict[str, str]:
    return {
        "X-Request-Id": plan.request.request_id,
        "X-Sample-Rate": str(state.engine.sample_rate_hz),
        "X-Channels": "1",
        "X-Bit-Depth": str(formats.PCM_BITS_PER_SAMPLE),
    }


async def _file_response(generation: Generation, request: Request,
                         state: ServerState) -> Response:
    """Collect everything (aborting if the client leaves), stretch, encode, answer once."""
    plan = generation.plan
    try:
        audio = await _unless_disconnected(generation.collect(), request)
        if audio is _CLIENT_GONE:
            generation.close()  # finish_reason unset: counts as "abort", frees the slot
            return Response(status_code=499)  # nobody is listening any more
        if plan.speed != 1.0:
            audio = await asyncio.to_thread(time_stretch, audio, plan.speed)
        data = await asyncio.to_thread(formats.encode_audio, audio, plan.response_format,
                                       state.engine.sample_rate_hz)
    except BaseException:
        generation.close(outcome="error")
        raise
    generation.close()
    headers = {
        **_stream_headers(plan, state),
        "X-Finish-Reason": str(generation.finish_reason),
        "X-Usage-Input-Tokens": str(plan.input_tokens),
        "X-Usage-Output-Tokens": str(generation.num_frames),
    }
    return Response(data, media_type=formats.MEDIA_TYPES[plan.response_format], headers=headers)


_CLIENT_GONE = object()


async def _unless_disconnected(awaitable: Awaitable[T], request: Request) -> T | object:
    """The awaitable's result, or _CLIENT_GONE (after cancelling it) if the client hangs up
    first. Cancelling engine work aborts the engine request and frees its slot."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        return _CLIENT_GONE
    return work.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _raw_audio(generation: Generation, state: ServerState) -> AsyncIterator[bytes]:
    """pcm: s16le bytes per chunk; wav: a streaming header (sizes 0xFFFFFFFF) first."""
    try:
        if generation.plan.response_format == "wav":
            yield formats.streaming_wav_header(state.engine.sample_rate_hz)
        async for chunk in generation.chunks():
            if chunk.audio.size:
                yield formats.float_to_pcm16(chunk.audio)
        if generation.finish_reason == "abort":
            # Aborted by the server (shutdown): end the body abruptly so it reads as truncated.
            generation.close()
            raise HiggsServeError("the request was aborted by the server before it finished")
    except HiggsServeError:
        generation.close(outcome="error")
        logger.warning("raw audio stream %s ended early", generation.plan.request.request_id,
                       exc_info=True)
        raise
    finally:
        generation.close()


async def _sse_events(generation: Generation, state: ServerState) -> AsyncIterator[bytes]:
    """speech.audio.delta per chunk, then speech.audio.done with usage (or .error)."""
    plan = generation.plan
    sent_audio = False
    try:
        if plan.response_format == "wav":
            yield sse.audio_delta(formats.streaming_wav_header(state.engine.sample_rate_hz))
        async for chunk in generation.chunks():
            if chunk.audio.size:
                yield sse.audio_delta(formats.float_to_pcm16(chunk.audio))
                sent_audio = True
        if generation.finish_reason == "abort":
            generation.close()
            yield sse.audio_error(error_object(
                "the request was aborted by the server before it finished", "server_error",
                code="aborted"), partial_audio=sent_audio)
            return
        yield sse.audio_done(plan.input_tokens, generation.num_frames, generation.finish_reason)
    except HiggsServeError as error:
        generation.close(outcome="error")
        api_error = to_api_error(error)
        yield sse.audio_error(error_object(api_error.message, api_error.type, api_error.param,
                                           api_error.code), partial_audio=sent_audio)
    finally:
        generation.close()
