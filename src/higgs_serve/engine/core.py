"""The engine loop: schedule → execute on Stage 0 → hand the rows to output processing.

The loop runs on its own thread. Callers on other threads add and abort requests through
`submit` / `abort`, which take the scheduler lock only for the bookkeeping itself; the lock is
never held while the GPU works. What a request becomes before it is scheduled is input
processing (engine/input_processor.py); what its rows become is output processing
(engine/output_processor.py); both are built by engine/builder.py and handed in as `EngineParts`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np

from higgs_serve.engine.deadlines.playback_clock import PlaybackClock, to_us
from higgs_serve.engine.output_processor import ChunkSink
from higgs_serve.engine.parts import EngineCounters, EngineHooks, EngineParts
from higgs_serve.engine.speech import AudioChunk, SpeechRequest
from higgs_serve.engine.stats import engine_stats
from higgs_serve.errors import EngineDeadError, EngineOverloadedError

__all__ = ["ChunkSink", "EngineCore", "EngineCounters", "EngineHooks", "EngineParts"]

logger = logging.getLogger(__name__)

_UNTIMED = contextlib.nullcontext()


class EngineCore:
    def __init__(self, parts: EngineParts, max_waiting: int, hooks: EngineHooks | None = None):
        self.parts = parts
        self.scheduler = parts.scheduler
        self.runner = parts.runner
        self.codec = parts.codec
        self.inputs = parts.inputs
        self.outputs = parts.outputs
        self.marks = parts.marks
        self.max_waiting = max_waiting
        self.hooks = hooks or EngineHooks()
        self._phase = self.hooks.profile or (lambda phase: _UNTIMED)
        self.counters = EngineCounters()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.dead_error: BaseException | None = None
        self._in_flight = None  # (plan, pending) launched but not yet collected
        self._last_collect = time.perf_counter()

    # ------------------------------------------------------------------ public (any thread)
    def submit(self, speech: SpeechRequest, sink: ChunkSink) -> PlaybackClock | None:
        """Admit a request or raise at once (overload, impossible request, a stream over its
        first-audio budget, dead engine); returns a stream's playback clock (None: no deadline)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine has stopped: {self.dead_error}")
        processed = self.inputs.process(speech)
        request = processed.request
        with self._lock:
            if speech.request_id in self.outputs:
                raise ValueError(f"duplicate request id {speech.request_id!r}")
            if self.scheduler.num_waiting >= self.max_waiting:
                raise EngineOverloadedError(f"the waiting queue is full ({self.max_waiting} requests); "
                                            "retry later")
            # opened first: the window rule says when a stream's first audio is due
            self.outputs.open(speech, sink, request.max_frames, processed.prompt_tokens, request.playback)
            try:
                self.scheduler.add_request(request)
            except BaseException:
                self.outputs.close(speech.request_id)
                raise
        self._wake.set()
        return request.playback

    def audio_sent(self, request_id: str, samples: int, at_s: float) -> None:
        """A stream's `samples` (at the model's rate) left for its listener at `at_s`
        (time.perf_counter()): its playback clock's feed (engine/deadlines/playback_clock.py)."""
        self.outputs.audio_sent(request_id, samples, to_us(at_s))

    def retry_after_s(self) -> int:
        """Seconds until a place under the stream limit is predicted to open for a stream that
        arrives now: a withdrawn stream's Retry-After (engine/deadlines/slack_policy.py)."""
        with self._lock:
            return self.scheduler.policy.retry_after_s(self.scheduler.running, self.scheduler.waiting)

    def abort(self, request_id: str) -> None:
        """Idempotent: frees the request's slot and blocks in the next step."""
        with self._lock:
            sink = self.outputs.close(request_id)
            if sink is None:
                return
            self.scheduler.abort(request_id)
        sink.put(AudioChunk(np.zeros(0, np.float32), True, 0, "abort"))
        self._wake.set()

    def stats(self) -> dict[str, float]:
        """A snapshot of the loop's and the stages' counters (engine/stats.py names them)."""
        with self._lock:
            return engine_stats(self.scheduler, self.outputs, self.runner, self.codec, self.marks)

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        """Start the stages' threads, then the step loop's thread."""
        self.start_stages()
        self._thread = threading.Thread(target=self._run, name="higgs-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, abort what is left, then the stages (`stop_stages`)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for request_id in self.outputs.request_ids():
            self.abort(request_id)
        self.stop_stages()

    def start_stages(self) -> None:
        """The watermark stage (when on), then the codec (tests that step by hand start only these)."""
        if self.marks is not None:
            self.marks.start()
        self.codec.start()

    def stop_stages(self) -> None:
        """The codec (it decodes what it holds), then the watermark stage (it marks what it got)."""
        self.codec.stop()
        if self.marks is not None:
            self.marks.stop()

    def _run(self) -> None:
        try:
            while not self._stopping:
                if not self.step():
                    self._wake.wait(0.05)
                    self._wake.clear()
            self._drain()
        except BaseException as exc:  # the loop must never die silently: fail every request
            logger.exception("engine loop died")
            self._die(exc)

    def step(self) -> bool:
        """One engine step with one-step lookahead: plan and launch step N+1 on the device, then
        wait for step N's rows and hand them out, so host scheduling overlaps GPU work.
        False when there was nothing to run."""
        with self._phase("step"):
            with self._phase("schedule"), self._lock:
                plan = self.scheduler.schedule()
            if plan is not None and self._in_flight is None:
                self._last_collect = time.perf_counter()  # step time counts from here after an idle spell
            launched = None
            if plan is not None:
                with self._phase("launch"):
                    launched = (plan, self.runner.launch(plan))
            in_flight, self._in_flight = self._in_flight, launched
            if in_flight is not None:
                self._complete(*in_flight)
            return launched is not None or in_flight is not None

    def _drain(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            self._complete(*in_flight)

    def _complete(self, plan, pending) -> None:
        with self._phase("collect"):
            result = self.runner.collect(pending)
        now = time.perf_counter()
        elapsed, self._last_collect = now - self._last_collect, now
        with self._phase("update"), self._lock:
            finished = self.scheduler.update(plan, result, to_us(elapsed))
        with self._phase("outputs"):
            self.outputs.emit(result.rows, {r.request_id for r in finished})
        self._record_step(elapsed, len(plan.chunks), len(result.rows))

    def _record_step(self, elapsed: float, num_seqs: int, num_rows: int) -> None:
        self.counters.steps += 1
        self.counters.step_time_s = elapsed
        self.counters.frames_generated += num_rows
        if self.hooks.on_step is not None:
            self.hooks.on_step(elapsed, num_seqs, num_rows)

    def _die(self, exc: BaseException) -> None:
        self.dead_error = exc
        for sink in self.outputs.close_all():
            sink.fail(EngineDeadError(f"the engine stopped: {exc}"))
