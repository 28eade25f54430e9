"""Aligner worker processes: alignment runs here, never on the caller's thread.

Why processes: PocketSphinx holds the GIL for the whole decode (about 20 ms of CPU per second of
audio, benchmarks/results/alignment_accuracy.json), so in a thread it would stall the server's
event loop and the engine's threads alike. Each worker process builds the aligners it is asked
for once (the en-US model loads in about 0.4 s) and keeps them.

Workers are started with "spawn": the server process holds torch, CUDA and threads, which must
not be forked; a spawned worker imports only `higgs_serve.alignment` (numpy, soxr, PocketSphinx,
num2words). A worker that dies (the pool reports BrokenProcessPool for its work) is replaced on
the next submit; work already queued gets that error, which callers report as missing timestamps.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from higgs_serve.alignment.aligner import Aligner, WordTiming

_ALIGNERS: dict[str, Aligner] = {}  # in a worker process: the aligners it has built


def align_in_worker(name: str, audio: np.ndarray, sample_rate_hz: int,
                    words: list[str]) -> list[WordTiming]:
    """Runs in a worker process: `words` aligned to `audio` by the aligner called `name`."""
    from higgs_serve.alignment.registry import build_aligner

    aligner = _ALIGNERS.get(name)
    if aligner is None:
        aligner = _ALIGNERS[name] = build_aligner(name)
    return aligner.align(audio, sample_rate_hz, words)


class AlignerPool:
    """At most `workers` aligner processes, started at the first submit (or `start`)."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"aligner workers must be at least 1, got {workers}")
        self.workers = workers
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._warmed: set[str] = set()

    def _live_executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"))
            return self._executor

    def submit(self, name: str, audio: np.ndarray, sample_rate_hz: int,
               words: list[str]) -> Future[list[WordTiming]]:
        """Queue one alignment; the future holds the timings or the aligner's error."""
        executor = self._live_executor()
        try:
            return executor.submit(align_in_worker, name, audio, sample_rate_hz, words)
        except BrokenProcessPool:  # a worker died earlier: start a fresh pool, once
            with self._lock:
                if self._executor is executor:
                    self._executor = None
            executor.shutdown(wait=False, cancel_futures=True)
            return self._live_executor().submit(align_in_worker, name, audio, sample_rate_hz, words)

    def start(self, name: str) -> Future[list[WordTiming]]:
        """Start the workers and build aligner `name` in one of them (an alignment of no words),
        so the first real request does not wait for the model to load."""
        return self.submit(name, np.zeros(4800, np.float32), 24000, [])

    def warm(self, name: str) -> None:
        """`start(name)` once per aligner, without waiting: called when a request asking for
        timestamps is planned, so the model loads while its first sentence is spoken."""
        with self._lock:
            if name in self._warmed:
                return
            self._warmed.add(name)
        self.start(name)

    def shutdown(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
