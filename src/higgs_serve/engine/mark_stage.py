"""The watermark stage: every audio chunk of every request is marked here, on its own thread,
before its sink sees it (docs/architecture.md#the-watermark-stage).

Chunks come from the codec thread (Stage 1). `wrap(sink)` gives a request a sink that prepares
each chunk's window at once (`MarkStream.window`: NumPy, the request's own order) and queues
it; the stage's thread marks queued windows in batches and hands each marked chunk to the
request's sink, in order. So the engine loop never waits for the mark, the codec thread only for
a copy, and the server and `synth` get the same marked audio from the same chunks.

Batches: each pass of the stage's loop marks every stream's pending window in one call (the
watermark takes windows of any lengths, each marked exactly as alone; on a GPU one padded batch,
one CUDA graph replay: audio/perth/rows.py, perth/runner.py). As in the codec
(codec/codec_runner.py `next_batch`), only each request's oldest queued chunk is eligible; when
more than `max_batch_windows` are, the key function `order` picks which go first (smallest key
first). The order, `deadline_first`: the earliest deadline of a stream's listener
(engine/deadlines/, read from its clock as the chunk is queued), then the shortest window (a
request's first chunk, the one its time to first audio waits for), then the oldest; streams
without a clock (files, an engine without deadlines) after those with one.

Ends and failures: an item without a window (an empty chunk, an error) is passed on at the start
of the pass, without a call. A failed call is retried window by window, so a window that cannot
be marked fails its own request only; a sink that raises fails its own request only; every
other request's audio goes on. `fail` goes through the queue (after the request's chunks
already queued); `finish` goes straight through (the core calls it before the final window
reaches the codec). This module imports no tensor library: the watermark itself is handed in
(audio/watermark.py's `Watermarker`, built by engine/builder.py on the codec's device).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from higgs_serve.audio.watermark import MarkStream, Watermarker
from higgs_serve.engine.output_processor import ChunkSink
from higgs_serve.engine.speech import AudioChunk

logger = logging.getLogger(__name__)


@dataclass
class MarkCounters:
    """Totals since start (Prometheus counters, `metrics.py`)."""

    calls: int = 0  # batched watermark calls
    chunks: int = 0  # non-empty chunks they marked
    audio_s: float = 0.0  # seconds of audio marked (24 kHz)
    busy_s: float = 0.0  # wall time in those calls


@dataclass
class PendingMark:
    """One queued chunk (or error) of one request, as the stage's `order` sees it."""

    sink: ChunkSink
    chunk: AudioChunk | None  # None: `error` is to be delivered
    window: np.ndarray | None = None  # the chunk's window; None for an empty chunk
    error: BaseException | None = None
    stream_id: int = 0  # which wrapped sink (request) it belongs to
    seq: int = 0  # arrival order across all requests (set by `MarkStage.enqueue`)
    deadline_us: int | None = None  # its stream's deadline when queued; None: no deadline


# A sort key of a pending window: the smallest keys are marked first when more are eligible than
# a call takes (the module note).
MarkOrder = Callable[[PendingMark], tuple]


def deadline_first(item: PendingMark) -> tuple[bool, int, int, int]:
    """The stage's order (module note): the earliest deadline, then the shortest window, then
    the oldest; windows without a deadline last."""
    return item.deadline_us is None, item.deadline_us or 0, item.window.size, item.seq


class _MarkingSink:
    """A request's sink as the codec sees it: chunks are marked on the stage's thread."""

    def __init__(self, stage: MarkStage, sink: ChunkSink, stream_id: int, deadline: Callable[[], int] | None):
        self._stage = stage
        self._sink = sink
        self._stream = MarkStream(stage.watermark.context_samples)
        self._id = stream_id
        self._deadline = deadline

    def put(self, chunk: AudioChunk) -> None:
        window = self._stream.window(chunk.audio) if chunk.audio.size else None
        deadline = self._deadline() if self._deadline is not None else None
        self._stage.enqueue(PendingMark(self._sink, chunk, window, stream_id=self._id, deadline_us=deadline))

    def fail(self, error: BaseException) -> None:
        self._stage.enqueue(PendingMark(self._sink, None, error=error, stream_id=self._id))

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None:
        self._sink.finish(rows, frames, finish_reason, prompt_tokens)


def next_batch(pending: list[PendingMark], max_batch: int,
               order: MarkOrder = deadline_first) -> list[PendingMark]:
    """The items one pass handles (module note): each stream's oldest only; all of those
    without a window (ends, errors: no call) first, then up to `max_batch` windows for one call,
    smallest `order` first."""
    eligible: list[PendingMark] = []
    seen: set[int] = set()
    for item in pending:
        if item.stream_id not in seen:
            seen.add(item.stream_id)
            eligible.append(item)
    windows = sorted((item for item in eligible if item.window is not None), key=order)
    return [item for item in eligible if item.window is None] + windows[:max_batch]


class MarkStage:
    def __init__(self, watermark: Watermarker, max_batch_windows: int, order: MarkOrder = deadline_first):
        self.watermark = watermark
        self.max_batch_windows = max_batch_windows
        self.order = order
        self.counters = MarkCounters()
        self.dead_error: BaseException | None = None
        self._queue: queue.SimpleQueue[PendingMark | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stream_ids = itertools.count(1)
        self._seq = itertools.count()

    def time_batches(self, chunk_samples: int, batches: tuple[int, ...], repeats: int = 3) -> dict[int, float]:
        """{b: seconds of a call marking b steady chunks of `chunk_samples`} (each window with
        its full context; the fastest of `repeats` after one untimed call): the deadline policy's
        Stage 1 cost, timed at start-up (engine/builder.py). Call it before `start`."""
        noise = np.random.default_rng(0).normal(0.0, 0.1, self.watermark.context_samples + chunk_samples)
        window = noise.astype(np.float32)
        timed = {}
        for batch in batches:
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                self.watermark.residuals([window] * batch)
                times.append(time.perf_counter() - t0)
            timed[batch] = min(times[1:])
        return timed

    def wrap(self, sink: ChunkSink, deadline: Callable[[], int] | None = None) -> ChunkSink:
        """`sink` with every chunk marked on the way (one per request, opened in order);
        `deadline()`: its stream's deadline (µs), read as each chunk is queued."""
        return _MarkingSink(self, sink, next(self._stream_ids), deadline)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="higgs-watermark", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Mark and deliver what is queued, then stop (after the codec has stopped)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def enqueue(self, item: PendingMark) -> None:
        if self.dead_error is not None:  # never leave a request waiting for audio that cannot come
            item.sink.fail(RuntimeError(f"the watermark stage has stopped: {self.dead_error}"))
            return
        item.seq = next(self._seq)
        self._queue.put(item)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        pending: list[PendingMark] = []
        try:
            self._loop(pending)
        except BaseException as exc:  # the loop must never die silently: fail what it holds
            logger.exception("watermark stage died")
            self.dead_error = exc
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    pending.append(item)
            for sink in {id(item.sink): item.sink for item in pending}.values():
                sink.fail(RuntimeError(f"the watermark stage stopped: {exc}"))

    def _loop(self, pending: list[PendingMark]) -> None:
        stopping = False
        while True:
            if not pending:
                if stopping:
                    return
                item = self._queue.get()
                if item is None:
                    return
                pending.append(item)
            while True:  # take in whatever arrived meanwhile
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    pending.append(item)
            batch = next_batch(pending, self.max_batch_windows, self.order)
            taken = {id(item) for item in batch}
            pending[:] = [item for item in pending if id(item) not in taken]
            for item in batch:
                if item.window is None:
                    self._pass_on(item)
            self._mark([item for item in batch if item.window is not None])

    def _mark(self, items: list[PendingMark]) -> None:
        """Mark `items` in one call and deliver them; a failed call is retried one window at a
        time, so only a window that fails alone fails its request."""
        if not items:
            return
        t0 = time.perf_counter()
        try:
            residuals = self.watermark.residuals([item.window for item in items])
        except (RuntimeError, ValueError) as exc:
            if len(items) == 1:
                logger.exception("watermark of a %d-sample window failed", items[0].window.size)
                self._fail(items[0], exc)
                return
            logger.warning("watermark of %d windows failed (%s): marking them one by one", len(items), exc)
            for item in items:
                self._mark([item])
            return
        self._count(items, time.perf_counter() - t0)
        for item, residual in zip(items, residuals, strict=True):
            self._deliver(item, residual)

    def _pass_on(self, item: PendingMark) -> None:
        if item.chunk is not None:
            self._deliver(item, None)
        else:
            self._fail(item, item.error)

    def _deliver(self, item: PendingMark, residual: np.ndarray | None) -> None:
        """`item`'s chunk, plus its part of `residual` when given, to its sink. One request's
        sink (or a bad residual) must not stop the other requests' audio: whatever it raises is
        logged with its traceback and fails that request only."""
        chunk = item.chunk
        try:
            if residual is not None:
                chunk = AudioChunk(MarkStream.apply(chunk.audio, residual), chunk.is_final, chunk.num_frames,
                                   chunk.finish_reason)
            item.sink.put(chunk)
        except Exception as exc:  # noqa: BLE001 - isolated and logged, not swallowed (docstring)
            logger.exception("delivering a marked chunk failed; failing its request")
            self._fail(item, exc)

    @staticmethod
    def _fail(item: PendingMark, error: BaseException) -> None:
        try:
            item.sink.fail(error)
        except Exception:  # noqa: BLE001 - as _deliver
            logger.exception("failing a request's sink failed")

    def _count(self, batch: list[PendingMark], seconds: float) -> None:
        c = self.counters
        c.calls += 1
        c.chunks += len(batch)
        c.audio_s += sum(item.chunk.audio.size for item in batch) / self.watermark.sample_rate_hz
        c.busy_s += seconds
