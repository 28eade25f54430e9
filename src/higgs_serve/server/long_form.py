"""Long-form POST /v1/audio/speech: an input longer than one segment budget is split
(text.group_segments) and spoken segment by segment (engine/long_form.py) as ONE response.

- file: the whole recording, encoded once; `X-Segments` holds the segment timestamps as compact
  JSON `[[char_start, char_end, start_s, end_s], ...]` (omitted past MAX_SEGMENTS_HEADER_BYTES,
  with `X-Segments-Omitted: <count>`; SSE carries them at any length).
- raw stream (pcm/wav): the samples only (headers are gone before the first segment ends).
- sse: `speech.audio.delta` as usual, a `speech.segment.done` event per segment as it finishes,
  and `speech.audio.done` with usage, finish_reason and every segment.

One admission slot covers the whole request (segments run one after another). The first
segment's first audio is awaited before the response starts, as for any request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from higgs_serve.audio import formats
from higgs_serve.audio.time_stretch import time_stretch
from higgs_serve.engine.long_form import LongFormSession, SegmentAudio, SegmentDone
from higgs_serve.errors import EngineOverloadedError, HiggsServeError
from higgs_serve.server import sse
from higgs_serve.server.errors import error_object, to_api_error
from higgs_serve.server.settings import ServerSettings
from higgs_serve.server.speech_plan import SpeechPlan
from higgs_serve.server.state import ServerState
from higgs_serve.text import Segment, group_segments

MAX_SEGMENTS_HEADER_BYTES = 16384


def plan_segments(text: str, settings: ServerSettings) -> list[Segment]:
    """The request's segments; one segment means an ordinary single request."""
    if len(text) <= settings.segment_max_chars:
        return [Segment(0, len(text), text, text)]
    return group_segments(text, settings.segment_max_chars)


def max_audio_samples(state: ServerState) -> int:
    return int(state.settings.max_audio_s * state.engine.sample_rate_hz)


class LongFormRun:
    """One admitted long-form request: its segment chain and its bookkeeping, done once."""

    def __init__(self, state: ServerState, plan: SpeechPlan, segments: list[Segment],
                 arrived_s: float):
        self._state = state
        self.plan = plan
        self.segments = segments
        self._arrived_s = arrived_s
        self.session = LongFormSession(state.engine.generate, plan.request,
                                       max_audio_samples(state))
        self._events = self._run()
        self._first: SegmentAudio | SegmentDone | None = None
        self._closed = False
        self.completed = False  # the chain ran to its end (every segment, or the audio cap)

    async def _run(self) -> AsyncIterator[SegmentAudio | SegmentDone]:
        for segment in self.segments:
            speech = self.session.speak(segment)
            try:
                async for event in speech:
                    if isinstance(event, (SegmentAudio, SegmentDone)):
                        yield event
            finally:
                await speech.aclose()  # at once, not when collected: aborts the engine request
            if self.session.finish_reason == "abort":
                return
            if self.session.length_capped:
                break
        self.completed = True

    async def start(self) -> None:
        """Wait for the first audio (errors surface before any response starts)."""
        try:
            self._first = await anext(self._events)
        except BaseException:
            await self.close(outcome=None, record=False)
            raise
        self._state.metrics.ttfa_seconds.observe(time.perf_counter() - self._arrived_s)

    async def events(self) -> AsyncIterator[SegmentAudio | SegmentDone]:
        first, self._first = self._first, None
        if first is not None:
            yield first
        async for event in self._events:
            yield event

    async def collect(self) -> np.ndarray:
        pieces = [e.audio async for e in self.events() if isinstance(e, SegmentAudio)]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    async def close(self, outcome: str | None = None, record: bool = True) -> None:
        """Abort what is unfinished, free the admission slot, record the outcome once."""
        if self._closed:
            return
        self._closed = True
        await self._events.aclose()  # closes the running segment: its engine request aborts
        state = self._state
        state.gate.release()
        if not record:
            return
        session = self.session
        state.metrics.count(outcome or (session.finish_reason if self.completed else "abort"))
        state.metrics.generated_frames.inc(session.num_frames)
        audio_s = session.num_samples / state.engine.sample_rate_hz
        state.metrics.audio_seconds.inc(audio_s)
        if self.completed and audio_s > 0:
            state.metrics.rtf.observe((time.perf_counter() - self._arrived_s) / audio_s)

    def timings(self, scale: float = 1.0) -> list[dict]:
        rate = self._state.engine.sample_rate_hz / scale
        return [done.timing(rate) for done in self.session.done]


async def create_long_form(plan: SpeechPlan, segments: list[Segment], request: Request,
                           state: ServerState, arrived_s: float) -> Response:
    """The caller validated the plan; this admits, starts and answers (see module doc)."""
    if not state.gate.try_acquire():
        state.metrics.count("rejected")
        raise EngineOverloadedError(f"the server is at capacity ({state.gate.capacity} requests "
                                    "in flight); retry later")
    run = LongFormRun(state, plan, segments, arrived_s)
    try:
        await run.start()
    except EngineOverloadedError:
        state.metrics.count("rejected")
        raise
    except BaseException:
        state.metrics.count("error")
        raise
    headers = {"X-Request-Id": plan.request.request_id,
               "X-Sample-Rate": str(state.engine.sample_rate_hz), "X-Channels": "1",
               "X-Bit-Depth": str(formats.PCM_BITS_PER_SAMPLE),
               "X-Segment-Count": str(len(segments))}
    if plan.mode == "file":
        return await _file(run, request, state, headers)
    headers["X-Time-To-First-Audio-Ms"] = f"{1e3 * (time.perf_counter() - arrived_s):.1f}"
    if plan.mode == "sse":
        return StreamingResponse(_sse(run, state), media_type=sse.MEDIA_TYPE,
                                 headers={**headers, "Cache-Control": "no-cache"},
                                 background=BackgroundTask(run.close))
    return StreamingResponse(_raw(run, state), media_type=formats.MEDIA_TYPES[plan.response_format],
                             headers={**headers, "Cache-Control": "no-cache"},
                             background=BackgroundTask(run.close))


async def _file(run: LongFormRun, request: Request, state: ServerState,
                headers: dict[str, str]) -> Response:
    plan = run.plan
    try:
        audio = await _unless_disconnected(run.collect(), request)
        if audio is None:
            await run.close()  # the client left: unfinished, counted as "abort"
            return Response(status_code=499)
        stretched = audio
        if plan.speed != 1.0:
            stretched = await asyncio.to_thread(time_stretch, audio, plan.speed)
        data = await asyncio.to_thread(formats.encode_audio, stretched, plan.response_format,
                                       state.engine.sample_rate_hz)
    except BaseException:
        await run.close(outcome="error")
        raise
    await run.close()
    # with speed != 1 the stretched recording is shorter by len(stretched)/len(audio): the
    # timestamps scale by the same ratio (exact only at speed 1)
    scale = len(stretched) / len(audio) if len(audio) else 1.0
    headers = {**headers, **_segments_header(run.timings(scale)),
               "X-Finish-Reason": run.session.finish_reason,
               "X-Usage-Input-Tokens": str(plan.input_tokens),
               "X-Usage-Output-Tokens": str(run.session.num_frames)}
    return Response(data, media_type=formats.MEDIA_TYPES[plan.response_format], headers=headers)


def _segments_header(timings: list[dict]) -> dict[str, str]:
    compact = [[t["char_start"], t["char_end"], t["start_s"], t["end_s"]] for t in timings]
    value = json.dumps(compact, separators=(",", ":"))
    if len(value) > MAX_SEGMENTS_HEADER_BYTES:
        return {"X-Segments-Omitted": str(len(timings))}
    return {"X-Segments": value}


async def _unless_disconnected(work, request: Request):
    """The awaitable's result, or None (after cancelling it) if the client hangs up first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def _raw(run: LongFormRun, state: ServerState) -> AsyncIterator[bytes]:
    try:
        if run.plan.response_format == "wav":
            yield formats.streaming_wav_header(state.engine.sample_rate_hz)
        async for event in run.events():
            if isinstance(event, SegmentAudio):
                yield formats.float_to_pcm16(event.audio)
        if run.session.finish_reason == "abort":
            raise HiggsServeError("the request was aborted by the server before it finished")
    except HiggsServeError:
        await run.close(outcome="error")
        raise
    finally:
        await run.close()


async def _sse(run: LongFormRun, state: ServerState) -> AsyncIterator[bytes]:
    plan, rate = run.plan, state.engine.sample_rate_hz
    sent_audio = False
    try:
        if plan.response_format == "wav":
            yield sse.audio_delta(formats.streaming_wav_header(rate))
        async for event in run.events():
            if isinstance(event, SegmentAudio):
                yield sse.audio_delta(formats.float_to_pcm16(event.audio))
                sent_audio = True
            else:
                yield sse.encode_event("speech.segment.done", event.timing(rate))
        session = run.session
        usage = {"input_tokens": plan.input_tokens, "output_tokens": session.num_frames,
                 "total_tokens": plan.input_tokens + session.num_frames}
        yield sse.encode_event("speech.audio.done", {
            "usage": usage, "finish_reason": session.finish_reason, "segments": run.timings()})
    except HiggsServeError as error:
        await run.close(outcome="error")
        api_error = to_api_error(error)
        yield sse.audio_error(error_object(api_error.message, api_error.type, api_error.param,
                                           api_error.code), partial_audio=sent_audio)
    finally:
        await run.close()
