"""The steps one admitted speech request goes through, shared by /speech (single and
long-form), /speech/batch and, for the counting and the output rate, WebSocket sentences.

admit_plan (bounded in-flight count, 429 past it; then the plan) -> start (submit, first chunk;
a failure counted by START_FAILURES) -> the response's `audio_out` pipeline (server/last_mile/audio_out.py:
stretch, output rate, the one int16 conversion, the format's encoder), chunk by chunk into a
stream or into one file (server/last_mile/audio_file.py). Headers are built here so every response says
the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
from fastapi import Request

from higgs_serve.audio import formats
from higgs_serve.errors import EngineOverloadedError, InvalidRequestError, OverCapacityError
from higgs_serve.audio.provenance import CLAIM_HEADER
from higgs_serve.server.last_mile.audio_file import AudioFile, FileSigning, collect_file
from higgs_serve.server.last_mile.audio_out import AudioOut, AudioTap
from higgs_serve.server.last_mile.playback_meter import PlaybackMeter
from higgs_serve.server.errors import RETRY_AFTER_S, ApiError
from higgs_serve.server.run.generation import Generation
from higgs_serve.server.schemas import SpeechRequestBody
from higgs_serve.server.plan.speech_plan import SpeechPlan, build_plan
from higgs_serve.server.state import ServerState
from higgs_serve.server.last_mile.word_timestamps import WordTimestampTap

CLIENT_GONE = object()  # what `unless_disconnected` returns when the client hung up
T = TypeVar("T")


async def admit_plan(body: SpeechRequestBody, state: ServerState) -> SpeechPlan:
    """Take an admission slot, then plan the request: the slot comes first, so no reference clip
    is fetched, decoded or encoded for a request the server has no room for (429, counted
    "rejected"). A plan that fails frees the slot and is counted "invalid"; the caller owns the
    slot of a plan returned."""
    if not state.gate.try_acquire():
        state.metrics.count("rejected")
        raise EngineOverloadedError(f"the server is at capacity ({state.gate.capacity} requests "
                                    "in flight); retry later")  # 429 + Retry-After (errors.py)
    try:
        return await build_plan(body, state)
    except BaseException as error:
        state.gate.release()
        if isinstance(error, (ApiError, InvalidRequestError)):
            state.metrics.count("invalid")
        raise


async def admit(body: SpeechRequestBody, state: ServerState, arrived_s: float) -> Generation:
    """admit_plan, as one engine request (its Generation frees the slot when closed)."""
    return Generation(state, await admit_plan(body, state), arrived_s)


# A start that fails is counted under the label of the first type it matches.
START_FAILURES = (
    (OverCapacityError, "over_capacity"),  # a 503: the stream would start past --ttfa-budget-s
    (EngineOverloadedError, "rejected"),
    (InvalidRequestError, "invalid"),
    (asyncio.CancelledError, "abort"),  # the batch it belongs to was abandoned
    (BaseException, "error"),
)


def failure_label(error: BaseException) -> str:
    """The outcome a start that failed with `error` is counted under (START_FAILURES)."""
    return next(label for kind, label in START_FAILURES if isinstance(error, kind))


@contextmanager
def counted_failures(state: ServerState) -> Iterator[None]:
    """Count an exception raised inside the block (`failure_label`) and re-raise it."""
    try:
        yield
    except BaseException as error:
        state.metrics.count(failure_label(error))
        raise


async def start(generation: Generation, state: ServerState,
                wrap: Callable[[Awaitable], Awaitable] | None = None) -> bool:
    """Submit and wait for the first chunk; False if `wrap` reports the client gone (counted
    "abort"; the slot is freed). Failures are counted by kind and re-raised."""
    with counted_failures(state):
        work = generation.start() if wrap is None else wrap(generation.start())
        if await work is CLIENT_GONE:
            state.metrics.count("abort")  # left while queued: start() was cancelled, slot freed
            return False
    if generation.aborted_before_audio:  # queued past the shutdown's grace period
        generation.close()
        raise shutting_down()
    return True


def shutting_down() -> ApiError:
    """What a request cut by the shutdown's grace period gets (OpenAI's error shape, 503)."""
    return ApiError(503, "the server is shutting down and aborted this request; retry later",
                    type="server_error", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def audio_out(plan: SpeechPlan, state: ServerState, seekable: bool = False,
              taps: tuple[AudioTap, ...] = (), meter: PlaybackMeter | None = None) -> AudioOut:
    """The response's pipeline: the plan's speed, rate and format (seekable: for a file); a
    stream's `meter` hears each chunk leave."""
    return AudioOut(plan.response_format, state.engine.sample_rate_hz, plan.sample_rate_hz,
                    plan.speed, state.encoders, seekable=seekable, taps=taps, meter=meter)


def word_tap(plan: SpeechPlan, state: ServerState) -> WordTimestampTap | None:
    """The response's word-timestamps tap when the request asked for them (the plan names its
    aligner); attach it with `audio_out(..., taps=(tap.push,))`."""
    if plan.aligner is None:
        return None
    return WordTimestampTap(state.aligner_pool, plan.aligner, state.engine.sample_rate_hz,
                            speed=plan.speed, on_aligned=state.metrics.observe_alignment,
                            on_delivered=state.metrics.observe_words_lag)


async def file_of(audio: AsyncIterator[np.ndarray], plan: SpeechPlan,
                  state: ServerState, taps: tuple[AudioTap, ...] = ()) -> AudioFile:
    """The whole-file path: every chunk of `audio` (24 kHz float) encoded into one AudioFile as
    it arrives, signed at the end when the server signs (the caller sends or reads it, then
    discards it)."""
    signing = (FileSigning(state.provenance, plan.response_format, state.encode_workers)
               if state.provenance is not None else None)
    return await collect_file(audio, audio_out(plan, state, seekable=True, taps=taps), signing)


def claim_headers(state: ServerState) -> dict[str, str]:
    """A stream's (or any audio without a manifest's) claim header on a signing server
    (audio/provenance.py)."""
    return {} if state.provenance is None else {CLAIM_HEADER: state.provenance.claim}


def audio_headers(plan: SpeechPlan) -> dict[str, str]:
    """Every audio response, streamed or not: what the bytes are, the language the request was
    checked for, and its input tokens (ours and sglang-omni's name: known before any audio).
    X-Bit-Depth only where the samples are on the wire (pcm, wav, flac: 16; G.711: 8)."""
    depth = formats.FORMATS[plan.response_format].bits_per_sample
    bits = {"X-Bit-Depth": str(depth)} if depth is not None else {}
    # a raw stream asking for word timestamps was held back until the audio was complete
    # (their header precedes the body): docs/api.md#word-timestamps
    if plan.buffered:
        bits["X-Audio-Buffered"] = "word_timestamps"
    return {
        "X-Request-Id": plan.request.request_id,
        "X-Sample-Rate": str(plan.sample_rate_hz),
        "X-Channels": "1",
        **bits,
        "X-Language": plan.language,
        "X-Usage-Input-Tokens": str(plan.input_tokens),
        "X-Prompt-Tokens": str(plan.input_tokens),
    }


def queue_headers(queue_wait_s: float | None) -> dict[str, str]:
    """A stream's wait for its place in the engine, part of its time to first audio (the engine
    speaking all the streams it can in real time; docs/api.md#over-capacity)."""
    return {} if queue_wait_s is None else {"X-Queue-Wait-Ms": f"{1e3 * queue_wait_s:.1f}"}


def file_headers(plan: SpeechPlan, finish_reason: str | None, num_frames: int,
                 engine_time_s: float) -> dict[str, str]:
    """A finished file (single or long-form, `stream: false`): what only the end knows, ours
    (X-Usage-*) and sglang-omni's usage names, same numbers."""
    return {
        **audio_headers(plan),
        "X-Finish-Reason": str(finish_reason),
        "X-Usage-Output-Tokens": str(num_frames),
        "X-Completion-Tokens": str(num_frames),
        "X-Engine-Time": f"{engine_time_s:.4f}",
    }


async def unless_disconnected(awaitable: Awaitable[T], request: Request) -> T | object:
    """The awaitable's result, or CLIENT_GONE (after cancelling it) if the client hangs up
    first. Cancelling engine work aborts the engine request and frees its slot."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        left = not work.done()
        if left:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    # a cancelled gather() ends with a CancelledError exception, not in the cancelled state
    # (issue 40 item 10); work that finished anyway (a cancellation swallowed by wait_for on
    # Python 3.11) gives its result, so whatever it holds is closed by its caller
    if left and (work.cancelled() or isinstance(work.exception(), asyncio.CancelledError)):
        return CLIENT_GONE
    return work.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
