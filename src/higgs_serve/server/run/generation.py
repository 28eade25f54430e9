"""One admitted speech request in flight: engine chunks in, bookkeeping done exactly once.

`Generation.start` submits to the engine and waits for the first chunk, so overload, impossible
requests, a stream past its first-audio budget and a dead engine surface before any response
starts; then its wait for a place in the engine is known (`queue_wait_s`, recorded). A streamed
response's `meter` (server/last_mile/playback_meter.py) hears its chunks leave. `close`
(idempotent) aborts the engine request if it has not finished, releases the admission slot and
records the outcome and the TTFA / RTF / frame metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np

from higgs_serve.engine.speech import AudioChunk
from higgs_serve.errors import OverCapacityError
from higgs_serve.server.last_mile.playback_meter import PlaybackMeter
from higgs_serve.server.plan.speech_plan import SpeechPlan
from higgs_serve.server.state import ServerState


def playback_meter(plan: SpeechPlan, state: ServerState) -> PlaybackMeter | None:
    """A streamed response's meter (server/last_mile/playback_meter.py); None for a file."""
    if plan.request.playback is None:
        return None
    return PlaybackMeter(state.engine.audio_sent, plan.request.request_id, state.metrics, plan.speed,
                         state.engine.sample_rate_hz)


class Generation:
    def __init__(self, state: ServerState, plan: SpeechPlan, arrived_s: float):
        self._state = state
        self.plan = plan
        self._arrived_s = arrived_s  # time.perf_counter() when the request arrived
        self._stream: AsyncIterator[AudioChunk] | None = None
        self._first: AudioChunk | None = None
        self._ttfa_recorded = False
        self.num_frames = 0
        self.num_samples = 0
        self.finish_reason: str | None = None
        self._submitted_s: float | None = None
        self.engine_time_s = 0.0  # submit -> final chunk (sglang-omni's X-Engine-Time)
        self._closed = False
        self.queue_wait_s: float | None = None  # a stream's wait for its place in the engine
        self.meter = playback_meter(plan, state)
        state.generations.add(self)

    async def start(self) -> None:
        """Submit and wait for the first chunk. The caller holds an admission slot; on error the
        slot is released here and the error propagates."""
        try:
            self._submitted_s = time.perf_counter()
            self._stream = self._state.engine.generate(self.plan.request)
            self._first = await self._first_chunk()
        except BaseException:
            self._finish(outcome=None, record=False)  # the router counts rejected vs error
            raise
        self.queue_wait_s = self._stream.queue_wait_s
        if self.queue_wait_s is not None:
            self._state.metrics.queue_wait_seconds.observe(self.queue_wait_s)

    async def _first_chunk(self) -> AudioChunk:
        """The first chunk. A stream still waiting for its place in the engine when its first
        audio could no longer come within --ttfa-budget-s (the engine's `withdraw_at_s`) is
        withdrawn: aborted, and refused as over capacity (a 503: docs/api.md#over-capacity)."""
        first = asyncio.ensure_future(anext(self._stream))
        while (withdraw_at := self._stream.withdraw_at_s) is not None:
            done, _ = await asyncio.wait({first}, timeout=max(0.0, withdraw_at - time.perf_counter()))
            if done:
                break
            if self._stream.withdraw_at_s is not None:  # still waiting: withdraw it
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)  # cancelling aborts it
                budget_s = self.plan.request.playback.ttfa_budget_s
                retry_s = self._stream.retry_after_s()  # when a place is predicted to open
                raise OverCapacityError(
                    f"the server is speaking as many streams as it can in real time; this one waited "
                    f"for its place until its first audio could no longer come within the server's "
                    f"{budget_s:g} s budget: retry in {retry_s} s", retry_s)
        return await first

    @property
    def aborted_before_audio(self) -> bool:
        """The engine aborted the request (the server's shutdown) before it produced audio."""
        first = self._first
        return first is not None and first.is_final and first.finish_reason == "abort"

    def abort(self) -> None:
        """Abort the engine request: its stream ends with a final "abort" chunk."""
        self._state.engine.abort(self.plan.request.request_id)

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        """Every chunk, in order, ending with the final one. Does not close (see `close`)."""
        if self._first is None:
            raise RuntimeError("Generation.chunks() before start()")
        chunk, self._first = self._first, None
        while True:
            self._account(chunk)
            yield chunk
            if chunk.is_final:
                return
            chunk = await anext(self._stream)

    def _account(self, chunk: AudioChunk) -> None:
        if chunk.audio.size and not self._ttfa_recorded:
            self._ttfa_recorded = True
            self._state.metrics.ttfa_seconds.observe(time.perf_counter() - self._arrived_s)
        self.num_frames += chunk.num_frames
        self.num_samples += chunk.audio.shape[0]
        if chunk.is_final:
            self.finish_reason = chunk.finish_reason
            self.engine_time_s = time.perf_counter() - self._submitted_s

    async def collect(self) -> np.ndarray:
        """All audio: [n] float32. `chunks` always yields at least the final chunk."""
        pieces = [chunk.audio async for chunk in self.chunks()]
        return np.concatenate(pieces).astype(np.float32, copy=False)

    def close(self, outcome: str | None = None) -> None:
        """Finish the bookkeeping once: abort if unfinished, free the slot, record metrics.

        outcome: None = derive from the finish reason ("abort" if the request never finished);
        "error" for a failure mid-way.
        """
        self._finish(outcome, record=True)

    def _finish(self, outcome: str | None, record: bool) -> None:
        if self._closed:
            return
        self._closed = True
        state = self._state
        state.generations.discard(self)
        if self.meter is not None:
            self.meter.close()
        if self.finish_reason is None:
            state.engine.abort(self.plan.request.request_id)
        state.gate.release()
        if not record:
            return
        metrics = state.metrics
        metrics.count(outcome or self.finish_reason or "abort")
        metrics.generated_frames.inc(self.num_frames)
        audio_s = self.num_samples / state.engine.sample_rate_hz
        metrics.audio_seconds.inc(audio_s)
        if self.finish_reason is not None and audio_s > 0:
            metrics.rtf.observe((time.perf_counter() - self._arrived_s) / audio_s)
