"""The engine loop: schedule → execute on Stage 0 → hand finished windows to Stage 1.

The loop runs on its own thread. Callers on other threads add and abort requests through
`submit` / `abort`, which take the scheduler lock only for the bookkeeping itself; the lock is
never held while the GPU works.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from higgs_serve.codec.chunker import Window, WindowParams
from higgs_serve.codec.codec_runner import CodecJob, CodecRunner
from higgs_serve.engine.output_stream import OutputStream
from higgs_serve.engine.request import TAIL_ROWS, Request
from higgs_serve.engine.scheduler import Scheduler
from higgs_serve.engine.speech import AudioChunk, SpeechRequest
from higgs_serve.errors import EngineDeadError, EngineOverloadedError
from higgs_serve.model.delay_pattern import apply_delay
from higgs_serve.model.prompt import PromptBuilder
from higgs_serve.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Minimum-length rule (SPEC §1.6): an utterance spans at least one full delay window.
MIN_FRAMES = 8
FRAMES_PER_SECOND = 25


def text_frame_cap(num_text_tokens: int) -> int:
    """Frame cap derived from the text: 4 s of slack plus 0.5 s per text token.

    Normal speech runs at 3-4 tokens per second, so this is about three times the expected
    length: long enough for slow, expressive reads, short enough that a model that fails to stop
    never produces a minute of silence for a short sentence.
    """
    return math.ceil(FRAMES_PER_SECOND * (4 + 0.5 * num_text_tokens))


class ChunkSink(Protocol):
    """Where one request's output goes. Called from the engine and codec threads."""

    def put(self, chunk: AudioChunk) -> None: ...

    def fail(self, error: BaseException) -> None: ...

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None: ...


@dataclass
class _Active:
    request: Request
    speech: SpeechRequest
    sink: ChunkSink
    out: OutputStream
    prompt_tokens: int


@dataclass
class EngineCounters:
    steps: int = 0
    step_time_s: float = 0.0  # of the last step
    frames_generated: int = 0


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        codec: CodecRunner,
        prompts: PromptBuilder,
        window: WindowParams,
        file_window: WindowParams,
        async_chunk: bool,
        max_model_len: int,
        max_waiting: int,
        num_codebooks: int,
        codebook_size: int,
    ):
        self.scheduler = scheduler
        self.runner = runner
        self.codec = codec
        self.prompts = prompts
        self.window = window
        # a request answered as one file is decoded in exact chunks as it is generated
        # (chunker.file_window_params); its sink collects them
        self.file_window = file_window
        # async_chunk false: codes go to the codec only once a request ends (one chunk each)
        self.async_chunk = async_chunk
        self.max_model_len = max_model_len
        self.max_waiting = max_waiting
        self.num_codebooks = num_codebooks
        self.codebook_size = codebook_size
        self.counters = EngineCounters()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._active: dict[str, _Active] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.dead_error: BaseException | None = None
        self._in_flight = None  # (plan, pending) launched but not yet collected
        self._last_collect = time.perf_counter()
        self.on_step = None  # optional callback(step_seconds, num_seqs, num_rows) for metrics

    # ------------------------------------------------------------------ public (any thread)
    def submit(self, speech: SpeechRequest, sink: ChunkSink) -> None:
        """Admit a request or raise at once (overload, impossible request, dead engine)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine has stopped: {self.dead_error}")
        request, prompt_tokens = self._build_request(speech)
        with self._lock:
            if speech.request_id in self._active:
                raise ValueError(f"duplicate request id {speech.request_id!r}")
            if self.scheduler.num_waiting >= self.max_waiting:
                raise EngineOverloadedError(
                    f"the waiting queue is full ({self.max_waiting} requests); retry later"
                )
            self.scheduler.add_request(request)
            window = self.window if speech.stream else self.file_window
            out = OutputStream(window, self.async_chunk, self.num_codebooks, self.codebook_size)
            self._active[speech.request_id] = _Active(request, speech, sink, out, prompt_tokens)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Idempotent: frees the request's slot and blocks in the next step."""
        with self._lock:
            active = self._active.pop(request_id, None)
            if active is None:
                return
            self.scheduler.abort(request_id)
        active.sink.put(AudioChunk(np.zeros(0, np.float32), True, 0, "abort"))
        self._wake.set()

    def stats(self) -> dict[str, float]:
        codec = self.codec.counters
        with self._lock:
            return {
                "num_running": self.scheduler.num_running,
                "num_waiting": self.scheduler.num_waiting,
                "num_active": len(self._active),
                "free_kv_blocks": self.scheduler.kv.num_free_blocks,
                "total_kv_blocks": self.scheduler.kv.num_blocks,
                "codec_calls": codec.calls,
                "codec_windows": codec.windows,
                "codec_graph_calls": codec.graph_calls,
                "codec_busy_seconds": codec.busy_s,
                "prefix_cache_queries": self.scheduler.kv.prefix_cache_queries,
                "prefix_cache_hits": self.scheduler.kv.prefix_cache_hits,
            }

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        """Start the codec thread, then the step loop's thread."""
        self.codec.start()
        self._thread = threading.Thread(target=self._run, name="higgs-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, abort what is left, then stop the codec (it decodes what it holds)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for rid in list(self._active):
            self.abort(rid)
        self.codec.stop()

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
        with self._lock:
            plan = self.scheduler.schedule()
        if plan is not None and self._in_flight is None:
            self._last_collect = time.perf_counter()  # step time counts from here after an idle spell
        launched = (plan, self.runner.launch(plan)) if plan is not None else None
        in_flight, self._in_flight = self._in_flight, launched
        if in_flight is not None:
            self._complete(*in_flight)
        return launched is not None or in_flight is not None

    def _drain(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            self._complete(*in_flight)

    def _complete(self, plan, pending) -> None:
        result = self.runner.collect(pending)
        now = time.perf_counter()
        elapsed, self._last_collect = now - self._last_collect, now
        with self._lock:
            finished = self.scheduler.update(plan, result)
        self._emit(result.rows, {r.request_id for r in finished})
        self._record_step(elapsed, len(plan.chunks), len(result.rows))

    def _record_step(self, elapsed: float, num_seqs: int, num_rows: int) -> None:
        self.counters.steps += 1
        self.counters.step_time_s = elapsed
        self.counters.frames_generated += num_rows
        if self.on_step is not None:
            self.on_step(elapsed, num_seqs, num_rows)

    def _die(self, exc: BaseException) -> None:
        self.dead_error = exc
        with self._lock:
            active, self._active = list(self._active.values()), {}
        for a in active:
            a.sink.fail(EngineDeadError(f"the engine stopped: {exc}"))

    # ------------------------------------------------------------------ outputs
    def _emit(self, rows: dict[str, tuple[int, ...]], finished: set[str]) -> None:
        for rid in rows.keys() | finished:
            active = self._active.get(rid)
            if active is None:  # aborted while its step was in flight
                continue
            if rid in rows:
                active.out.append(rows[rid])
            done = rid in finished
            nxt = active.out.next_window(done)
            reason = self._finish(active) if done else None  # a finished request's window is final
            if nxt is not None:
                self._submit_window(active, *nxt, reason)

    def _finish(self, active: _Active) -> str:
        """Hand the finished request's rows and frames to its sink; returns the finish reason."""
        rid = active.speech.request_id
        frames = active.out.all_frames()
        reason = "length" if len(frames) >= active.request.max_frames else "stop"
        with self._lock:
            self._active.pop(rid, None)
        active.sink.finish(active.out.rows.copy(), frames, reason, active.prompt_tokens)
        return reason

    def _submit_window(self, active: _Active, window: Window, frames: np.ndarray, reason: str | None) -> None:
        sink = active.sink

        def deliver(job: CodecJob, audio: np.ndarray | None, error: BaseException | None = None) -> None:
            if error is not None:
                sink.fail(error)
                return
            sink.put(AudioChunk(audio, job.is_final, window.new_frames, reason))

        self.codec.submit(
            CodecJob(
                request_id=active.speech.request_id,
                frames=frames,
                trim_front_frames=window.trim_front_frames,
                trim_back_frames=window.trim_back_frames,
                is_final=window.is_final,
                deliver=deliver,
                decode_from_frames=window.decode_from_frame,
            )
        )

    # ------------------------------------------------------------------ request building
    def _build_request(self, speech: SpeechRequest) -> tuple[Request, int]:
        sampling = speech.sampling
        if sampling.seed is None:
            sampling = sampling.with_seed(secrets.randbits(63))
        text_tokens = self.prompts.count_text_tokens(speech.text)
        placeholder = {}
        if speech.reference is None:
            prompt = self.prompts.zero_shot(speech.text)
        else:
            ref_rows = apply_delay(speech.reference.codes).numpy()
            clone = self.prompts.clone(speech.text, len(ref_rows), speech.reference.ref_text)
            prompt = clone.token_ids
            placeholder = dict(
                placeholder_key=speech.reference.content_key,
                placeholder_start=clone.placeholder_start,
                num_placeholders=clone.num_placeholders,
                placeholder_rows=tuple(map(tuple, ref_rows.tolist())),
            )
        # the EOC row and the ramp follow the last frame (the scheduler's worst-case context)
        room = self.max_model_len - len(prompt) - TAIL_ROWS
        max_frames = min(sampling.max_new_tokens, text_frame_cap(text_tokens), max(room, 1))
        min_frames = min(max(MIN_FRAMES, sampling.min_new_tokens), max_frames)
        request = Request(
            request_id=speech.request_id,
            prompt_token_ids=tuple(prompt),
            sampling=sampling,
            max_frames=max_frames,
            min_frames=min_frames,
            **placeholder,
        )
        return request, len(prompt)
