"""Front ends of the engine: an asyncio one for the server, a blocking one for batch use.

Both submit to the same `EngineCore`, whose loop runs on its own thread; chunks come back from
the engine and codec threads through a sink.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np

from higgs_serve.codec.codec_config import REQUIRED_SAMPLE_RATE
from higgs_serve.config.deploy import DeployConfig
from higgs_serve.engine.builder import LoadedModel, RuntimeOptions, build_engine_core, load_model
from higgs_serve.engine.core import EngineCore, EngineHooks
from higgs_serve.engine.deadlines.playback_clock import US_PER_S, PlaybackClock
from higgs_serve.engine.speech import AudioChunk, SpeechRequest, SpeechResult
from higgs_serve.errors import EngineDeadError

logger = logging.getLogger(__name__)


class _AsyncSink:
    """Moves chunks from engine threads onto one request's asyncio queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self.queue: asyncio.Queue[AudioChunk | BaseException] = asyncio.Queue()
        self.frames: np.ndarray | None = None  # set by finish(), before the final chunk is queued

    def _push(self, item: AudioChunk | BaseException) -> None:
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop closed: nobody is listening any more
            pass

    def put(self, chunk: AudioChunk) -> None:
        self._push(chunk)

    def fail(self, error: BaseException) -> None:
        self._push(error)

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None:
        # the core calls finish() before it hands the final window to the codec, so the frames
        # are in place when the final chunk reaches the queue (long-form chains read them)
        self.frames = frames


class RequestStream(AsyncIterator[AudioChunk]):
    """The chunks of one request. Closing it early (or cancelling) aborts the request."""

    def __init__(self, core: EngineCore, request_id: str, sink: _AsyncSink, clock: PlaybackClock | None = None):
        self._core = core
        self.request_id = request_id
        self._sink = sink
        self._clock = clock
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> AudioChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._sink.queue.get()
        except asyncio.CancelledError:
            self.abort()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.is_final:
            self._done = True
        return item

    @property
    def frames(self) -> np.ndarray | None:
        """[T, 8] int64 de-delayed codes of a finished request (after its final chunk); None if
        it did not finish (aborted, failed)."""
        return self._sink.frames

    @property
    def withdraw_at_s(self) -> float | None:
        """A stream still waiting for its place at this time (time.perf_counter()) can no longer
        have its first audio within its budget: withdraw it then (None: admitted, no budget)."""
        at = None if self._clock is None else self._clock.withdraw_at_us
        return None if at is None else at / US_PER_S

    @property
    def queue_wait_s(self) -> float | None:
        """How long a stream waited for its place in the engine (None: not a stream, or still
        waiting); known once its first chunk arrived."""
        wait = None if self._clock is None else self._clock.queue_wait_us
        return None if wait is None else wait / US_PER_S

    def retry_after_s(self) -> int:
        """When a stream withdrawn now may try again (EngineCore.retry_after_s)."""
        return self._core.retry_after_s()

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._core.abort(self.request_id)

    async def aclose(self) -> None:
        self.abort()


def stream_from_core(core: EngineCore, request: SpeechRequest) -> RequestStream:
    """Submit to a running core; the chunks arrive on the calling event loop."""
    sink = _AsyncSink(asyncio.get_running_loop())
    clock = core.submit(request, sink)
    return RequestStream(core, request.request_id, sink, clock)


class AsyncEngine:
    """`generate` returns at once with a stream, or raises (overload, bad request, dead engine)."""

    @property
    def sample_rate_hz(self) -> int:
        """The loaded checkpoint's codec rate; before the load, the one rate its config accepts."""
        return self.loaded.spec.codec.sample_rate if self.loaded is not None else REQUIRED_SAMPLE_RATE

    def __init__(self, model: str, deploy: DeployConfig, options: RuntimeOptions | None = None):
        self.model = model
        self.deploy = deploy
        self.options = options or RuntimeOptions()
        self.loaded: LoadedModel | None = None
        self.core: EngineCore | None = None
        self.ready = False

    @property
    def prompt_builder(self):
        return self.loaded.prompts if self.loaded else None

    async def start(self, hooks: EngineHooks | None = None) -> None:
        """Load, warm up and capture, then start the loop; `hooks` (metrics, profiling) are
        called by the loop from then on (engine/core.py)."""
        # Loads on a daemon thread, not the loop's default executor: asyncio.run waits for that
        # executor's threads when it ends, so a server stopped during the load (Ctrl-C, SIGTERM)
        # would wait for the whole load. A daemon thread lets the process exit at once.
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not started.done():
                started.set_exception(error) if error is not None else started.set_result(None)

        def run() -> None:
            try:
                self._start_blocking(hooks)
                error = None
            except BaseException as e:  # handed to the awaiting task
                error = e
            try:
                loop.call_soon_threadsafe(settle, error)
            except RuntimeError:  # the loop is gone: nobody waits for this engine any more
                if self.core is not None:
                    self.core.stop()

        threading.Thread(target=run, name="engine-start", daemon=True).start()
        await started

    def _start_blocking(self, hooks: EngineHooks | None) -> None:
        self.loaded = load_model(self.model, self.options, self.deploy)
        self.core = build_engine_core(self.loaded, self.deploy, self.options, hooks)
        self.core.start()
        self.ready = True

    async def shutdown(self) -> None:
        self.ready = False
        if self.core is not None:
            await asyncio.to_thread(self.core.stop)

    @property
    def alive(self) -> bool:
        return self.core is not None and self.core.dead_error is None

    def generate(self, request: SpeechRequest) -> RequestStream:
        if self.core is None:
            raise EngineDeadError("the engine is not started")
        return stream_from_core(self.core, request)

    def abort(self, request_id: str) -> None:
        if self.core is not None:
            self.core.abort(request_id)

    def audio_sent(self, request_id: str, samples: int, at_s: float) -> None:
        """A stream's audio left for its listener (EngineCore.audio_sent); any thread."""
        if self.core is not None:
            self.core.audio_sent(request_id, samples, at_s)

    def stats(self) -> dict[str, float]:
        return self.core.stats() if self.core is not None else {}


class CollectingSink:
    """Collects one request's output for the blocking helper. Public: tests step the engine by
    hand with it (tests/engine/engine_harness.py) instead of a copy of the sink contract."""

    def __init__(self, on_chunk: Callable[[str, AudioChunk], None] | None, request_id: str):
        self.request_id = request_id
        self.on_chunk = on_chunk
        self.chunks: list[AudioChunk] = []
        self.rows: np.ndarray | None = None
        self.frames: np.ndarray | None = None
        self.finish_reason = "abort"
        self.prompt_tokens = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def put(self, chunk: AudioChunk) -> None:
        self.chunks.append(chunk)
        if self.on_chunk is not None:
            self.on_chunk(self.request_id, chunk)
        if chunk.is_final:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None:
        self.rows, self.frames, self.finish_reason = rows, frames, finish_reason
        self.prompt_tokens = prompt_tokens


class SyncEngine:
    """Blocking helper: run a batch of requests concurrently and return their full results."""

    def __init__(self, loaded: LoadedModel, deploy: DeployConfig, options: RuntimeOptions,
                 hooks: EngineHooks | None = None):
        self.loaded = loaded
        self.core = build_engine_core(loaded, deploy, options, hooks)
        self.core.start()

    @classmethod
    def from_model(cls, model: str, deploy: DeployConfig, options: RuntimeOptions,
                   hooks: EngineHooks | None = None) -> SyncEngine:
        return cls(load_model(model, options, deploy), deploy, options, hooks)

    def generate_batch(
        self,
        requests: Sequence[SpeechRequest],
        on_chunk: Callable[[str, AudioChunk], None] | None = None,
    ) -> list[SpeechResult]:
        sinks = [CollectingSink(on_chunk, r.request_id) for r in requests]
        for request, sink in zip(requests, sinks):
            self.core.submit(request, sink)
        results = []
        for request, sink in zip(requests, sinks):
            sink.done.wait()
            if sink.error is not None:
                raise sink.error
            results.append(self._result(request, sink))
        return results

    def _result(self, request: SpeechRequest, sink: CollectingSink) -> SpeechResult:
        audio = np.concatenate([c.audio for c in sink.chunks]) if sink.chunks else np.zeros(0, np.float32)
        return SpeechResult(
            request_id=request.request_id,
            rows=sink.rows,
            frames=sink.frames,
            audio=audio.astype(np.float32, copy=False),
            chunks=sink.chunks,
            finish_reason=sink.finish_reason,
            prompt_tokens=sink.prompt_tokens,
        )

    def close(self) -> None:
        self.core.stop()
