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
An alignment that fails (too little audio for its words, a worker that died) gives `words=None`:
the audio is unaffected and the surface reports the sentence's timestamps as missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from higgs_serve.alignment import WordTiming, user_words
from higgs_serve.alignment.pool import AlignerPool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentenceWords:
    index: int  # the sentence's number in this response, from 0
    text: str  # the sentence as the user wrote it (tags included)
    offset_s: float  # where the sentence's audio starts on the response's timeline
    duration_s: float  # its audio's length
    words: list[WordTiming] | None  # sentence-relative; None: alignment failed

    def on_timeline(self) -> list[WordTiming] | None:
        """The words on the response's timeline (shifted by the sentence's offset)."""
        if self.words is None:
            return None
        return [word.shifted(self.offset_s) for word in self.words]


class WordTimestampTap:
    def __init__(self, pool: AlignerPool, aligner_name: str, sample_rate_hz: int):
        self._pool = pool
        self._aligner = aligner_name
        self._rate = sample_rate_hz
        self._chunks: list[np.ndarray] = []  # the current sentence's audio, as pushed
        self._pushed = 0  # samples pushed before the current sentence
        self._current = 0  # samples of the current sentence
        self._pending: deque[tuple[SentenceWords, asyncio.Future]] = deque()
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
        meta = SentenceWords(self._count, text, self._pushed / self._rate, self._current / self._rate, None)
        words = user_words(text)
        self._count += 1
        self._pushed += self._current
        self._chunks, self._current = [], 0
        if not words:
            future = asyncio.get_running_loop().create_future()
            future.set_result([])
        else:
            future = asyncio.wrap_future(self._pool.submit(self._aligner, audio, self._rate, words))
        self._pending.append((meta, future))
        self._arrived.set()

    def finish(self) -> None:
        """No more sentences: `results()` ends after the last one queued."""
        self._finished = True
        self._arrived.set()

    # ------------------------------------------------------------------ results, in order
    @property
    def lagging(self) -> int:
        """Sentences queued whose alignment is not done yet."""
        return sum(not future.done() for _, future in self._pending)

    def ready(self) -> list[SentenceWords]:
        """The sentences aligned by now, in order, each returned once (never waits)."""
        done = []
        while self._pending and self._pending[0][1].done():
            done.append(self._resolve(*self._pending.popleft()))
        return done

    async def results(self) -> AsyncIterator[SentenceWords]:
        """Every sentence in order, each as soon as it is aligned; ends after `finish()` once
        all are delivered."""
        while True:
            if self._pending:
                meta, future = self._pending[0]
                await asyncio.wait([future])
                if self._pending and self._pending[0][1] is future:
                    self._pending.popleft()
                    yield self._resolve(meta, future)
                continue
            if self._finished:
                return
            self._arrived.clear()
            await self._arrived.wait()

    async def drain(self) -> list[SentenceWords]:
        """Wait for every sentence queued so far; in order."""
        done = []
        while self._pending:
            meta, future = self._pending.popleft()
            await asyncio.wait([future])
            done.append(self._resolve(meta, future))
        return done

    def close(self) -> None:
        """Drop what is not delivered (the response ended): queued alignments are cancelled
        where the pool has not started them."""
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self.finish()

    def _resolve(self, meta: SentenceWords, future: asyncio.Future) -> SentenceWords:
        if future.cancelled():
            return meta
        error = future.exception()
        if error is not None:
            logger.warning("word timestamps for sentence %d are missing: %s", meta.index, error)
            return meta
        return SentenceWords(meta.index, meta.text, meta.offset_s, meta.duration_s, future.result())
