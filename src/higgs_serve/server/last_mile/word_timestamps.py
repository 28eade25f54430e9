"""The word-timestamps tap of one response: fed the response's 24 kHz audio as it is made and
told where each sentence (segment) ends, it aligns each finished sentence in an aligner worker
process (alignment/pool.py) and hands the results back in sentence order.

It never delays audio: `push` only keeps a reference to the chunk, `end_sentence` only queues
the sentence's audio for a worker; nothing here waits on the event loop or the engine's thread.
Results arrive when the worker is done, which takes about 2 % of the sentence's duration in CPU
(benchmarks/results/alignment_accuracy.json), so sentence k's words are ready long before
sentence k + 1 has been spoken: timestamps lag the audio by at most one sentence unless the
aligner workers are saturated (`lagging` counts sentences still queued behind).

Times: each sentence is aligned on its own (its words relative to its first sample, as
vllm-omni's WebSocket reports them), and `SentenceWords.on_timeline()` shifts them by the
sentence's offset on the response's timeline: the number of samples pushed before it, which is
exact across long-form segments (engine/long_form.py adds and removes no sample at its joins).
An alignment that fails (too little audio for its words, an aligner process that died twice
under it, aligners too far behind: alignment/pool.py) gives `words=None` and its `error`: the
audio is unaffected and the surface reports the sentence's timestamps as missing (SSE says why).

Lag: `on_delivered` is told, for each sentence handed to its surface, the seconds since the
sentence's audio ended (`higgs_serve_words_lag_seconds`): what the isolation of the aligners
(a lower priority, other cores: config/worker_processes.py) costs the words under load.

Speed: the tap sees the engine's audio before the time stretch (server/last_mile/audio_out.py), so a
response at `speed` s has every time (offsets, durations, words) multiplied by 1 / s, the same
scaling X-Segments uses; the stretch keeps the order and the relative place of every sample.

The surfaces' shapes (docs/api.md#word-timestamps) are built here too: the REST header with
its size rule, and the JSON list every surface carries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from higgs_serve.alignment import WordTiming, user_words
from higgs_serve.alignment.pool import AlignerPool
from higgs_serve.errors import AlignmentError

logger = logging.getLogger(__name__)

# vllm-omni's rule for its REST header: the JSON list up to 4096 bytes, else
# `X-Word-Timestamps-Omitted: oversize; bytes=N; limit=4096` (the words then come only on SSE or
# the WebSocket). About 80 words fit.
MAX_HEADER_BYTES = 4096
WORDS_EVENT = "speech.words"  # the SSE event carrying one sentence's words (ours: docs/api.md)

# (seconds from a sentence's end to its words, failed) for each alignment: metrics.py
OnAligned = Callable[[float, bool], None]
# seconds from a sentence's end to its words handed to the response: metrics.py
OnDelivered = Callable[[float], None]


def words_json(words: list[WordTiming] | None) -> list[dict] | None:
    """The peers' list `[{word, start_ms, end_ms}]` (None stays None: alignment failed)."""
    return None if words is None else [word.to_json() for word in words]


def header_of(sentences: list[SentenceWords]) -> dict[str, str]:
    """The REST headers of a finished response's words, on its timeline: `X-Word-Timestamps`
    (ASCII-escaped compact JSON) up to MAX_HEADER_BYTES, else `X-Word-Timestamps-Omitted`.
    A sentence that failed to align keeps its words with null times, so the list always has
    one entry per word of the input."""
    entries = []
    for sentence in sentences:
        timed = sentence.on_timeline()
        if timed is None:
            entries += [{"word": word, "start_ms": None, "end_ms": None}
                        for word in user_words(sentence.text)]
        else:
            entries += words_json(timed)
    value = json.dumps(entries, separators=(",", ":"), ensure_ascii=True)
    if len(value) > MAX_HEADER_BYTES:
        return {"X-Word-Timestamps-Omitted":
                f"oversize; bytes={len(value)}; limit={MAX_HEADER_BYTES}"}
    return {"X-Word-Timestamps": value}


@dataclass(frozen=True)
class SentenceWords:
    index: int  # the sentence's number in this response, from 0
    text: str  # the sentence as the user wrote it (tags included)
    offset_s: float  # where the sentence's audio starts on the response's timeline
    duration_s: float  # its audio's length
    words: list[WordTiming] | None  # sentence-relative; None: alignment failed
    error: AlignmentError | None = None  # why the words are missing (None when cancelled)

    def to_json(self) -> dict:
        """The SSE `speech.words` payload: the sentence's span and its words on the response's
        timeline, in milliseconds; `words` null when its alignment failed, with an `error`
        {code, message} saying why."""
        payload = {"index": self.index, "start_ms": round(1e3 * self.offset_s),
                   "end_ms": round(1e3 * (self.offset_s + self.duration_s)),
                   "words": words_json(self.on_timeline())}
        if self.words is None and self.error is not None:
            payload["error"] = {"code": self.error.code, "message": str(self.error)}
        return payload

    def on_timeline(self) -> list[WordTiming] | None:
        """The words on the response's timeline (shifted by the sentence's offset)."""
        if self.words is None:
            return None
        return [word.shifted(self.offset_s) for word in self.words]


class WordTimestampTap:
    def __init__(self, pool: AlignerPool, aligner_name: str, sample_rate_hz: int,
                 speed: float = 1.0, on_aligned: OnAligned | None = None,
                 on_delivered: OnDelivered | None = None):
        self._pool = pool
        self._aligner = aligner_name
        self._rate = sample_rate_hz
        self._scale = 1.0 / speed  # response seconds per engine second
        self._on_aligned = on_aligned
        self._on_delivered = on_delivered
        self._chunks: list[np.ndarray] = []  # the current sentence's audio, as pushed
        self._pushed = 0  # samples pushed before the current sentence
        self._current = 0  # samples of the current sentence
        # (the sentence without its words, its alignment, perf_counter when its audio ended)
        self._pending: deque[tuple[SentenceWords, asyncio.Future, float]] = deque()
        self._count = 0
        self._finished = False
        self._arrived = asyncio.Event()  # set whenever a sentence is queued or the tap finished

    # ------------------------------------------------------------------ feeding (never waits)
    def push(self, audio: np.ndarray) -> None:
        """audio: [n] float32 at the tap's rate, the response's next samples."""
        if len(audio):
            self._chunks.append(audio)
            self._current += len(audio)

    def end_sentence(self, text: str) -> None:
        """The audio pushed since the last end is the speech of `text`: queue its alignment."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        meta = SentenceWords(self._count, text, self._scale * self._pushed / self._rate,
                             self._scale * self._current / self._rate, None)
        words = user_words(text)
        self._count += 1
        self._pushed += self._current
        self._chunks, self._current = [], 0
        if not words:
            future = asyncio.get_running_loop().create_future()
            future.set_result([])
        else:
            future = asyncio.wrap_future(self._pool.submit(self._aligner, audio, self._rate, words))
            if self._on_aligned is not None:
                future.add_done_callback(self._reporter(time.perf_counter()))
        self._pending.append((meta, future, time.perf_counter()))
        self._arrived.set()

    def finish(self) -> None:
        """No more sentences: `results()` ends after the last one queued."""
        self._finished = True
        self._arrived.set()

    # ------------------------------------------------------------------ results, in order
    @property
    def lagging(self) -> int:
        """Sentences queued whose alignment is not done yet."""
        return sum(not future.done() for _, future, _ in self._pending)

    def ready(self) -> list[SentenceWords]:
        """The sentences aligned by now, in order, each returned once (never waits)."""
        done = []
        while self._pending and self._pending[0][1].done():
            done.append(self._deliver(*self._pending.popleft()))
        return done

    async def results(self) -> AsyncIterator[SentenceWords]:
        """Every sentence in order, each as soon as it is aligned; ends after `finish()` once
        all are delivered."""
        while True:
            if self._pending:
                future = self._pending[0][1]
                await asyncio.wait([future])
                if self._pending and self._pending[0][1] is future:
                    yield self._deliver(*self._pending.popleft())
                continue
            if self._finished:
                return
            self._arrived.clear()
            await self._arrived.wait()

    async def drain(self) -> list[SentenceWords]:
        """Wait for every sentence queued so far; in order."""
        done = []
        while self._pending:
            meta, future, ended_s = self._pending.popleft()
            await asyncio.wait([future])
            done.append(self._deliver(meta, future, ended_s))
        return done

    def close(self) -> None:
        """Drop what is not delivered (the response ended): queued alignments are cancelled
        where the pool has not started them."""
        for _, future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        self.finish()

    def _reporter(self, queued_s: float) -> Callable[[asyncio.Future], None]:
        def report(future: asyncio.Future) -> None:
            if not future.cancelled():
                self._on_aligned(time.perf_counter() - queued_s, future.exception() is not None)
        return report

    def _deliver(self, meta: SentenceWords, future: asyncio.Future, ended_s: float) -> SentenceWords:
        if self._on_delivered is not None:
            self._on_delivered(time.perf_counter() - ended_s)
        return self._resolve(meta, future)

    def _resolve(self, meta: SentenceWords, future: asyncio.Future) -> SentenceWords:
        if future.cancelled():
            return meta
        error = future.exception()
        if error is not None:
            logger.warning("word timestamps for sentence %d are missing: %s", meta.index, error)
            if not isinstance(error, AlignmentError):
                error = AlignmentError(str(error))
            return SentenceWords(meta.index, meta.text, meta.offset_s, meta.duration_s, None, error)
        words = future.result()
        if self._scale != 1.0:
            words = [word.scaled(self._scale) for word in words]
        return SentenceWords(meta.index, meta.text, meta.offset_s, meta.duration_s, words)
