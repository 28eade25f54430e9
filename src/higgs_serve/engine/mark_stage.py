"""The watermark stage: every audio chunk of every request is marked here, on its own thread,
before its sink sees it (docs/architecture.md#the-watermark-stage).

Chunks come from the codec thread (Stage 1). `wrap(sink)` gives a request a sink that prepares
each chunk's window at once (`MarkStream.window`: NumPy, the request's own order) and queues
it; the stage's thread marks queued windows in batches and hands each marked chunk to the
request's sink, in order. So the engine loop never waits for the mark, the codec thread only for
a copy, and the server and `synth` get the same marked audio from the same chunks.

Batches: like the codec's (codec/codec_runner.py `next_batch`), only each request's oldest
queued chunk is eligible, and among those the most urgent goes first (`urgency`: the earliest
deadline of a stream's listener, engine/deadlines/, read from its clock as the chunk is queued;
without deadlines the shortest window, a request's first chunk, so the mark adds one small call
to time to first audio, not a queue). Windows of one batch have one length (no padding, one
shape per chunk length on a GPU): the most urgent window's, the most urgent of that length.

`fail` goes through the queue as well (after the request's chunks already queued); `finish`
goes straight through (the core calls it before the final window reaches the codec).
This module imports no tensor library: the watermark itself is handed in (audio/watermark.py's
`Watermarker`, built by engine/builder.py on the codec's device).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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
class _Item:
    sink: ChunkSink
    chunk: AudioChunk | None  # None: `error` is to be delivered
    window: np.ndarray | None = None  # the chunk's window; None for an empty chunk
    error: BaseException | None = None
    stream_id: int = field(default=0)  # which wrapped sink (request) it belongs to
    deadline_us: int | None = None  # its stream's deadline when queued; None: no deadline


def urgency(item: _Item) -> tuple[bool, int, int]:
    """The order windows are marked in (module note): the earliest deadline, then the shortest."""
    return item.deadline_us is None, item.deadline_us or 0, item.window.size


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
        self._stage.enqueue(_Item(self._sink, chunk, window, stream_id=self._id, deadline_us=deadline))

    def fail(self, error: BaseException) -> None:
        self._stage.enqueue(_Item(self._sink, None, error=error, stream_id=self._id))

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None:
        self._sink.finish(rows, frames, finish_reason, prompt_tokens)


def next_batch(pending: list[_Item], max_batch: int) -> list[_Item]:
    """The next items to handle together (module note): each stream's oldest only, the shortest
    windows first, one window length per batch. An item without a window (an empty chunk, an
    error) goes alone and first, so ends and failures are never held behind audio."""
    eligible: list[_Item] = []
    seen: set[int] = set()
    for item in pending:
        if item.stream_id not in seen:
            seen.add(item.stream_id)
            eligible.append(item)
    for item in eligible:
        if item.window is None:
            return [item]
    length = min(eligible, key=urgency).window.size
    return sorted((item for item in eligible if item.window.size == length), key=urgency)[:max_batch]


class MarkStage:
    def __init__(self, watermark: Watermarker, max_batch_windows: int):
        self.watermark = watermark
        self.max_batch_windows = max_batch_windows
        self.counters = MarkCounters()
        self.dead_error: BaseException | None = None
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._next_id = 0
        self._id_lock = threading.Lock()

    def wrap(self, sink: ChunkSink, deadline: Callable[[], int] | None = None) -> ChunkSink:
        """`sink` with every chunk marked on the way (one per request, opened in order);
        `deadline()`: its stream's deadline (µs), read as each chunk is queued."""
        with self._id_lock:
            self._next_id += 1
            stream_id = self._next_id
        return _MarkingSink(self, sink, stream_id, deadline)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="higgs-watermark", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Mark and deliver what is queued, then stop (after the codec has stopped)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def enqueue(self, item: _Item) -> None:
        if self.dead_error is not None:  # never leave a request waiting for audio that cannot come
            item.sink.fail(RuntimeError(f"the watermark stage has stopped: {self.dead_error}"))
            return
        self._queue.put(item)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        pending: list[_Item] = []
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

    def _loop(self, pending: list[_Item]) -> None:
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
            batch = next_batch(pending, self.max_batch_windows)
            taken = {id(item) for item in batch}
            pending[:] = [item for item in pending if id(item) not in taken]
            self._mark_and_deliver(batch)

    def _mark_and_deliver(self, batch: list[_Item]) -> None:
        if batch[0].window is None:
            item = batch[0]
            if item.chunk is not None:
                item.sink.put(item.chunk)
            else:
                item.sink.fail(item.error)
            return
        t0 = time.perf_counter()
        try:
            residuals = self.watermark.residuals([item.window for item in batch])
        except (RuntimeError, ValueError) as exc:  # fails only the requests in this batch
            logger.exception("watermark of %d chunks failed", len(batch))
            for item in batch:
                item.sink.fail(exc)
            return
        self._count(batch, time.perf_counter() - t0)
        for item, residual in zip(batch, residuals):
            chunk = item.chunk
            marked = MarkStream.apply(chunk.audio, residual)
            item.sink.put(AudioChunk(marked, chunk.is_final, chunk.num_frames, chunk.finish_reason))

    def _count(self, batch: list[_Item], seconds: float) -> None:
        c = self.counters
        c.calls += 1
        c.chunks += len(batch)
        c.audio_s += sum(item.chunk.audio.size for item in batch) / self.watermark.sample_rate_hz
        c.busy_s += seconds
