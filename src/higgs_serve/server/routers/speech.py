"""POST /v1/audio/speech: the audio streamed as it is made (raw bytes of the format, or SSE
events), or with `stream: false` one file (docs/api.md#streaming).

Order of work: validate the body's schema, refuse at once if the engine is dead or warming up,
admit (bounded in-flight count, 429 past it; before any reference clip is fetched, decoded or
encoded), build the plan (speech_plan), split an input longer than one segment (long_form.py),
submit and wait for the first chunk (speech_run); only then does a response start. After that point
a failure ends a raw stream abruptly (the client sees a truncated body) or becomes a
`speech.audio.error` event. A client that disconnects cancels the response, which aborts the
engine request through `Generation.close`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from higgs_serve.audio import formats
from higgs_serve.errors import EngineDeadError, HiggsServeError
from higgs_serve.server.run import long_form
from higgs_serve.server.run import speech_run
from higgs_serve.server.last_mile import sse
from higgs_serve.server.last_mile.audio_file import AudioFile, file_response
from higgs_serve.server.last_mile.raw_stream import RawAudioResponse
from higgs_serve.server.errors import RETRY_AFTER_S, ApiError, error_object, to_api_error
from higgs_serve.server.run.generation import Generation
from higgs_serve.server.run.read_ahead import read_ahead
from higgs_serve.server.schemas import ERROR_RESPONSES, SpeechRequestBody
from higgs_serve.server.limits.send_timeout import ClosingStreamingResponse
from higgs_serve.server.state import ServerState, server_state
from higgs_serve.server.last_mile.word_timestamps import (WORDS_EVENT, SentenceWords, WordTimestampTap,
                                                 header_of)

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
    check_engine(state)
    plan = await speech_run.admit_plan(body, state)  # the input limit is checked here
    try:
        segments = await long_form.plan_segments(body.input, state.settings)
    except BaseException:
        state.gate.release()
        raise
    if len(segments) > 1:  # split and spoken as one recording (server/run/long_form.py)
        return await long_form.create_long_form(plan, segments, request, state, arrived_s)
    generation = Generation(state, plan, arrived_s)
    if not await speech_run.start(generation, state,
                                  lambda work: speech_run.unless_disconnected(work, request)):
        return Response(status_code=499)
    if plan.mode == "file":
        return await _file_response(generation, request, state)
    # the server's own share of the time to first audio, as OpenAI reports its processing time:
    # beside the client's own TTFA it tells time in the server from time on the way to it
    headers = {**speech_run.audio_headers(plan), **speech_run.claim_headers(state),
               "Cache-Control": "no-cache",
               "X-Time-To-First-Audio-Ms": f"{1e3 * (time.perf_counter() - arrived_s):.1f}",
               **speech_run.queue_headers(generation.queue_wait_s)}
    if plan.mode == "sse":
        # bodies made ahead of a slow reader: the slot is freed when the engine's audio is all
        # encoded, not when a stalled client has read it (server/run/read_ahead.py)
        return ClosingStreamingResponse(read_ahead(_sse_events(generation, state)), media_type=sse.MEDIA_TYPE,
                                        headers={**headers, "X-Accel-Buffering": "no"},
                                        background=BackgroundTask(generation.close))
    return RawAudioResponse(read_ahead(_raw_audio(generation, state)), request_id=plan.request.request_id,
                            media_type=formats.MEDIA_TYPES[plan.response_format],
                            headers=headers, background=BackgroundTask(generation.close))


def check_engine(state: ServerState) -> None:
    """503 while the engine is dead or warming up (before any reference is fetched or encoded)."""
    if state.engine_dead():
        raise EngineDeadError()  # 503 engine_dead (errors.py)
    if not state.engine_ready():
        raise ApiError(503, "the engine is still warming up; retry shortly",
                       type="server_error", code="not_ready",
                       headers={"Retry-After": str(RETRY_AFTER_S)})


async def _file_response(generation: Generation, request: Request,
                         state: ServerState) -> Response:
    """Encode the chunks into one file as they arrive (aborting if the client leaves), then
    answer it with its Content-Length (server/last_mile/audio_file.py)."""
    plan = generation.plan
    tap = speech_run.word_tap(plan, state)
    try:
        answer = await speech_run.unless_disconnected(_file_and_words(generation, state, tap), request)
        file, words = (None, None) if answer is speech_run.CLIENT_GONE else answer
        if file is None:
            generation.close()  # finish_reason unset: counts as "abort", frees the slot
            return Response(status_code=499)  # nobody is listening any more
        if generation.finish_reason == "abort":  # cut by the shutdown's grace period
            file.discard()
            generation.close()
            raise speech_run.shutting_down()
    except BaseException:
        generation.close(outcome="error")
        raise
    finally:
        if tap is not None:
            tap.close()
    generation.close()
    headers = speech_run.file_headers(plan, generation.finish_reason, generation.num_frames,
                                      generation.engine_time_s)
    if tap is not None:
        headers.update(header_of(words))
    return file_response(file, formats.MEDIA_TYPES[plan.response_format], headers)


async def _file_and_words(generation: Generation, state: ServerState, tap: WordTimestampTap | None
                          ) -> tuple[AudioFile, list[SentenceWords] | None]:
    """The file, and (with a tap) its words once aligned (the request is one sentence)."""
    plan = generation.plan
    file = await speech_run.file_of(_audio(generation), plan, state,
                                    taps=() if tap is None else (tap.push,))
    if tap is None:
        return file, None
    try:
        tap.end_sentence(plan.request.text)
        return file, await tap.drain()
    except BaseException:
        file.discard()
        raise


async def _audio(generation: Generation) -> AsyncIterator[np.ndarray]:
    async for chunk in generation.chunks():
        yield chunk.audio


async def _encoded(generation: Generation, state: ServerState,
                   tap: WordTimestampTap | None = None) -> AsyncIterator[bytes]:
    """The response format's bytes, chunk by chunk, as the pipeline releases them (the tap,
    if any, sees each chunk's 24 kHz audio first)."""
    out = speech_run.audio_out(generation.plan, state, taps=() if tap is None else (tap.push,),
                               meter=generation.meter)
    try:
        async for chunk in generation.chunks():
            data = await (out.close(chunk.audio) if chunk.is_final else out.push(chunk.audio))
            if data:
                yield data
    finally:
        out.release()


async def _raw_audio(generation: Generation, state: ServerState) -> AsyncIterator[bytes]:
    """The format's bytes as they are made (wav: a streaming header, sizes 0xFFFFFFFF, first)."""
    try:
        async for data in _encoded(generation, state):
            yield data
        if generation.finish_reason == "abort":
            # Aborted by the server (shutdown): end the body abruptly so it reads as truncated.
            generation.close()
            raise HiggsServeError("the request was aborted by the server before it finished")
    except HiggsServeError:  # RawAudioResponse logs it (one line) and ends the body cut
        generation.close(outcome="error")
        raise
    finally:
        generation.close()


async def _sse_events(generation: Generation, state: ServerState) -> AsyncIterator[bytes]:
    """speech.audio.delta (base64 of the format's bytes) as they are made, then
    speech.audio.done with usage (or .error)."""
    plan = generation.plan
    sent_audio = False
    tap = speech_run.word_tap(plan, state)
    try:
        async for data in _encoded(generation, state, tap):
            yield sse.audio_delta(data)
            sent_audio = True
        if tap is not None:  # the request is one sentence: its words after its audio
            tap.end_sentence(plan.request.text)
            for sentence in await tap.drain():
                yield sse.encode_event(WORDS_EVENT, sentence.to_json())
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
        if tap is not None:
            tap.close()
        generation.close()
