"""Long-form POST /v1/audio/speech: an input longer than one segment budget is split
(text.group_segments) and spoken segment by segment (engine/long_form.py) as ONE response.

- file (`stream: false`): the whole recording, encoded into one file as it is spoken
  (server/last_mile/audio_file.py: bounded memory, spilled to disk past 1 MiB); `X-Segments` holds the segment timestamps as compact
  JSON `[[char_start, char_end, start_s, end_s], ...]` (omitted past MAX_SEGMENTS_HEADER_BYTES,
  with `X-Segments-Omitted: <count>`; SSE carries them at any length).
- raw stream (any format): the audio only (headers are gone before the first segment ends).
- sse: `speech.audio.delta` as usual, a `speech.segment.done` event per segment as it finishes,
  and `speech.audio.done` with usage, finish_reason and every segment.

With `word_timestamps` each segment's audio is aligned as it ends (server/last_mile/word_timestamps.py),
on the recording's one timeline: the file's `X-Word-Timestamps` header (a raw stream asking for
them is answered as the file), or a `speech.words` event per segment on SSE, sent as soon as it
is aligned and never waited for by the audio (at most one segment behind until the end).

One admission slot covers the whole request (segments run one after another). The first
segment's first audio is awaited before the response starts, as for any request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from higgs_serve.audio import formats
from higgs_serve.engine.long_form import LongFormSession, SegmentAudio, SegmentDone
from higgs_serve.engine.speech import AudioChunk, SpeechRequest
from higgs_serve.errors import HiggsServeError
from higgs_serve.server.run import speech_run
from higgs_serve.server.run.generation import playback_meter
from higgs_serve.server.last_mile import sse
from higgs_serve.server.last_mile.audio_file import AudioFile, file_response
from higgs_serve.server.errors import error_object, to_api_error
from higgs_serve.server.last_mile.raw_stream import RawAudioResponse
from higgs_serve.server.limits.send_timeout import ClosingStreamingResponse
from higgs_serve.server.run.read_ahead import read_ahead
from higgs_serve.server.settings import ServerSettings
from higgs_serve.server.plan.speech_plan import SpeechPlan
from higgs_serve.server.state import ServerState
from higgs_serve.server.last_mile.word_timestamps import WORDS_EVENT, SentenceWords, WordTimestampTap, header_of
from higgs_serve.text import Segment, group_segments

MAX_SEGMENTS_HEADER_BYTES = 16384
# A long-form request logs its start, then a line per finished segment at most this often (and
# its last), so a log shows a request of hours is alive without a line per segment.
PROGRESS_LOG_S = 10.0

logger = logging.getLogger(__name__)


async def plan_segments(text: str, settings: ServerSettings) -> list[Segment]:
    """The request's segments; one segment means an ordinary single request. Called once the
    request is admitted and its input within --max-input-chars; splitting takes about 1 s per
    million characters, so it runs off the event loop."""
    if len(text) <= settings.segment_max_chars:
        return [Segment(0, len(text), text, text)]
    return await asyncio.to_thread(group_segments, text, settings.segment_max_chars)


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
        self.meter = playback_meter(plan, state)  # a stream's, over every segment
        self.session = LongFormSession(self._generate, plan.request, max_audio_samples(state))
        self._events = self._run()
        self._first: SegmentAudio | SegmentDone | None = None
        self._closed = False
        self.started_s = time.perf_counter()  # the chain's engine time runs from here
        self._logged_s = self.started_s  # the last progress line
        self._aborted = False
        state.generations.add(self)  # the shutdown's grace period aborts it (abort_in_flight)
        self.completed = False  # the chain ran to its end (every segment, or the audio cap)

    def _generate(self, request: SpeechRequest) -> AsyncIterator[AudioChunk]:
        """The engine's `generate`; for a stream, each segment's audio is reported as it leaves,
        and a later segment is due when its listener runs out of the earlier ones' audio (it is
        never refused: the response has started)."""
        if self.meter is not None:
            self.meter.report_to(request.request_id)
            if self.session.num_segments > 1:
                due_s = self.meter.deadline_s()
                request = replace(request, playback=replace(request.playback, ttfa_budget_s=None,
                                                            first_audio_due_s=due_s))
        return self._state.engine.generate(request)

    async def _run(self) -> AsyncIterator[SegmentAudio | SegmentDone]:
        logger.info("long-form %s: %d segments, %d characters", self.plan.request.request_id,
                    len(self.segments), self.segments[-1].end - self.segments[0].start)
        for segment in self.segments:
            if self._aborted:
                return
            speech = self.session.speak(segment)
            try:
                async for event in speech:
                    if isinstance(event, (SegmentAudio, SegmentDone)):
                        yield event
                    if isinstance(event, SegmentDone):
                        self._log_progress(event)
            finally:
                await speech.aclose()  # at once, not when collected: aborts the engine request
            if self.session.finish_reason == "abort":
                return
            if self.session.length_capped:
                break
        self.completed = True

    def _log_progress(self, done: SegmentDone) -> None:
        now = time.perf_counter()
        last = done.index + 1 == len(self.segments)
        if not last and now - self._logged_s < PROGRESS_LOG_S:
            return
        self._logged_s = now
        logger.info("long-form %s: segment %d/%d done, %.1f s of audio in %.1f s",
                    self.plan.request.request_id, done.index + 1, len(self.segments),
                    done.end_sample / self._state.engine.sample_rate_hz, now - self.started_s)

    async def start(self) -> None:
        """Wait for the first audio (errors surface before any response starts). Cancelled
        (the client left while queued): the chain is closed unrecorded, its slot freed."""
        try:
            self._first = await anext(self._events)
        except BaseException:
            await self.close(outcome=None, record=False)
            raise
        self._state.metrics.ttfa_seconds.observe(time.perf_counter() - self._arrived_s)

    @property
    def aborted_before_audio(self) -> bool:
        """The shutdown aborted the first segment before it produced audio."""
        first = self._first
        return isinstance(first, SegmentDone) and first.finish_reason == "abort"

    async def events(self) -> AsyncIterator[SegmentAudio | SegmentDone]:
        first, self._first = self._first, None
        if first is not None:
            yield first
        async for event in self._events:
            yield event

    async def audio(self) -> AsyncIterator[np.ndarray]:
        """The recording's audio as it is spoken: [n] float32 at 24 kHz per piece."""
        async for event in self.events():
            if isinstance(event, SegmentAudio):
                yield event.audio

    @property
    def finish_reason(self) -> str:
        """The recording's: "abort" also when the shutdown stopped the chain between segments
        (then every segment spoken ended normally, but the rest of the input was never started)."""
        if self._aborted and not self.completed:
            return "abort"
        return self.session.finish_reason

    def abort(self) -> None:
        """Stop the chain: the segment being spoken is aborted in the engine, no other starts."""
        self._aborted = True
        if self.session.current_request_id is not None:
            self._state.engine.abort(self.session.current_request_id)

    async def close(self, outcome: str | None = None, record: bool = True) -> None:
        """Abort what is unfinished, free the admission slot, record the outcome once."""
        if self._closed:
            return
        self._closed = True
        await self._events.aclose()  # closes the running segment: its engine request aborts
        if self.meter is not None:
            self.meter.close()
        state = self._state
        state.generations.discard(self)
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
    """Start an admitted plan's chain (its slot, taken before any reference work, covers every
    segment) and answer (see module doc)."""
    run = LongFormRun(state, plan, segments, arrived_s)
    with speech_run.counted_failures(state):  # labelled as a single request's start
        started = await speech_run.unless_disconnected(run.start(), request)
    if started is speech_run.CLIENT_GONE:
        state.metrics.count("abort")  # left while queued: start() was cancelled, slot freed
        return Response(status_code=499)
    if run.aborted_before_audio:  # queued past the shutdown's grace period
        await run.close()
        raise speech_run.shutting_down()
    headers = {**speech_run.audio_headers(plan), "X-Segment-Count": str(len(segments))}
    if plan.mode == "file":
        return await _file(run, request, state, headers)
    headers["X-Time-To-First-Audio-Ms"] = f"{1e3 * (time.perf_counter() - arrived_s):.1f}"
    headers.update(speech_run.claim_headers(state))  # a stream carries no manifest
    if plan.mode == "sse":
        # no proxy buffering, as for a single request's events
        # made ahead of a slow reader, as a single request's (server/run/read_ahead.py)
        return ClosingStreamingResponse(read_ahead(_sse(run, state)), media_type=sse.MEDIA_TYPE,
                                        headers={**headers, "Cache-Control": "no-cache",
                                                 "X-Accel-Buffering": "no"},
                                        background=BackgroundTask(run.close))
    return RawAudioResponse(read_ahead(_raw(run, state)), request_id=plan.request.request_id,
                            media_type=formats.MEDIA_TYPES[plan.response_format],
                            headers={**headers, "Cache-Control": "no-cache"},
                            background=BackgroundTask(run.close))


async def _file(run: LongFormRun, request: Request, state: ServerState,
                headers: dict[str, str]) -> Response:
    plan = run.plan
    tap = speech_run.word_tap(plan, state)
    try:
        # encoded (stretched, resampled) into one spooled file while it is spoken
        answer = await speech_run.unless_disconnected(_file_and_words(run, state, tap), request)
        file, words = (None, None) if answer is speech_run.CLIENT_GONE else answer
        if file is None:
            await run.close()  # the client left: unfinished, counted as "abort"
            return Response(status_code=499)
        if run.finish_reason == "abort":  # cut by the shutdown's grace period
            file.discard()
            await run.close()
            raise speech_run.shutting_down()
    except BaseException:
        await run.close(outcome="error")
        raise
    finally:
        if tap is not None:
            tap.close()
    await run.close()
    # speed != 1 shortens the recording by 1/speed: the timestamps scale alike (exact at speed 1)
    usage = speech_run.file_headers(plan, run.finish_reason, run.session.num_frames,
                                    time.perf_counter() - run.started_s)
    headers = {**headers, **usage, **_segments_header(run.timings(1.0 / plan.speed))}
    if tap is not None:
        headers.update(header_of(words))
    return file_response(file, formats.MEDIA_TYPES[plan.response_format], headers)


async def _file_and_words(run: LongFormRun, state: ServerState, tap: WordTimestampTap | None
                          ) -> tuple[AudioFile, list[SentenceWords] | None]:
    """The recording's file and (with a tap) every segment's words, aligned while it is spoken."""
    file = await speech_run.file_of(_audio_marking(run, tap), run.plan, state,
                                    taps=() if tap is None else (tap.push,))
    if tap is None:
        return file, None
    try:
        return file, await tap.drain()
    except BaseException:
        file.discard()
        raise


async def _audio_marking(run: LongFormRun, tap: WordTimestampTap | None) -> AsyncIterator[np.ndarray]:
    """The recording's audio; each segment's end marked on the tap. The file path pushes each
    piece through the pipeline (and so the tap) before it asks for the next, so a segment's
    audio is all in the tap when its end is marked."""
    async for event in run.events():
        if isinstance(event, SegmentAudio):
            yield event.audio
        elif tap is not None:
            tap.end_sentence(event.segment.text)


def _segments_header(timings: list[dict]) -> dict[str, str]:
    compact = [[t["char_start"], t["char_end"], t["start_s"], t["end_s"]] for t in timings]
    value = json.dumps(compact, separators=(",", ":"))
    if len(value) > MAX_SEGMENTS_HEADER_BYTES:
        return {"X-Segments-Omitted": str(len(timings))}
    return {"X-Segments": value}


async def _raw(run: LongFormRun, state: ServerState) -> AsyncIterator[bytes]:
    out = None
    try:
        out = speech_run.audio_out(run.plan, state, meter=run.meter)  # its speed, rate and format
        async for audio in run.audio():
            data = await out.push(audio)
            if data:
                yield data
        tail = await out.close()
        if tail:
            yield tail
        if run.finish_reason == "abort":
            # aborted by the server (shutdown): counted "abort", the body ends truncated
            await run.close()
            raise HiggsServeError("the request was aborted by the server before it finished")
    except HiggsServeError:
        await run.close(outcome="error")
        raise
    finally:
        if out is not None:
            out.release()
        await run.close()


async def _sse(run: LongFormRun, state: ServerState) -> AsyncIterator[bytes]:
    plan = run.plan
    # timings: the engine's samples, scaled by the stretch (speed != 1) as the file's are
    rate = state.engine.sample_rate_hz * plan.speed
    tap = speech_run.word_tap(plan, state)
    # the request's speed, rate and format; the tap sees the engine's audio first
    out = speech_run.audio_out(plan, state, taps=() if tap is None else (tap.push,), meter=run.meter)
    sent_audio = False
    try:
        async for event in run.events():
            if isinstance(event, SegmentAudio):
                data = await out.push(event.audio)
                if data:
                    yield sse.audio_delta(data)
                    sent_audio = True
            else:
                yield sse.encode_event("speech.segment.done", event.timing(rate))
                if tap is not None:  # queued now; sent when ready, never waited for here
                    tap.end_sentence(event.segment.text)
            for sentence in tap.ready() if tap is not None else ():
                yield sse.encode_event(WORDS_EVENT, sentence.to_json())
        tail = await out.close()
        if tail:
            yield sse.audio_delta(tail)
        for sentence in await tap.drain() if tap is not None else ():
            yield sse.encode_event(WORDS_EVENT, sentence.to_json())
        session = run.session
        if run.finish_reason == "abort":  # aborted by the server (shutdown): counted "abort"
            await run.close()
            yield sse.audio_error(error_object(
                "the request was aborted by the server before it finished", "server_error",
                code="aborted"), partial_audio=sent_audio)
            return
        usage = {"input_tokens": plan.input_tokens, "output_tokens": session.num_frames,
                 "total_tokens": plan.input_tokens + session.num_frames}
        yield sse.encode_event("speech.audio.done", {
            "usage": usage, "finish_reason": run.finish_reason,
            "segments": run.timings(1.0 / plan.speed)})
    except HiggsServeError as error:
        await run.close(outcome="error")
        api_error = to_api_error(error)
        yield sse.audio_error(error_object(api_error.message, api_error.type, api_error.param,
                                           api_error.code), partial_audio=sent_audio)
    finally:
        if tap is not None:
            tap.close()
        out.release()
        await run.close()
