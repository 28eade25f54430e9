"""alignment/pool.py and alignment/worker.py: independent aligner processes (issue 52). Real
processes, killed and stopped: a dead or silent worker costs only its own alignments (retried
once elsewhere), is replaced, and never stalls the others; queued audio is bounded; empty audio
never breaks a worker. Each test bounds its waits; timeouts come through the pool's settings."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future, wait

import numpy as np
import pytest

from higgs_serve.alignment import user_words
from higgs_serve.alignment.pool import AlignerPool
from higgs_serve.alignment.worker import answer
from higgs_serve.config.worker_processes import WorkerPlacement, server_cpus
from higgs_serve.errors import AlignerFailedError, AlignerOverloadedError, AlignmentError
from support.aligned_speech import aligned_speech

ALIGNER = "pocketsphinx-en"


@pytest.fixture(scope="module")
def speech():
    return aligned_speech()


def _until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _submit(pool: AlignerPool, speech, repeat: int = 1) -> Future:
    audio = np.tile(speech.audio, repeat)
    return pool.submit(ALIGNER, audio, speech.sample_rate_hz, user_words(" ".join([speech.text] * repeat)))


def _started(timeout_s: float = 1.0, workers: int = 2, **options) -> AlignerPool:
    pool = AlignerPool(workers, timeout_s=timeout_s, **options)
    pool.start(ALIGNER).result(timeout=120)  # every process up with its model loaded
    return pool


def _busy_worker(pool: AlignerPool, index: int):
    worker = pool._workers[index]
    _until(lambda: worker.current is not None and worker.current.audio is not None)
    return worker


def test_a_killed_worker_costs_nothing_but_a_retry_and_is_replaced(speech):
    """Six sentences over two workers, one worker SIGKILLed mid-alignment: all six are aligned
    (the one it was on retried on the other, its queue moved), a replacement takes its place."""
    pool = _started()
    try:
        futures = [_submit(pool, speech, repeat=2) for _ in range(6)]
        victim = _busy_worker(pool, 0).process.pid
        os.kill(victim, signal.SIGKILL)
        results = [future.result(timeout=60) for future in futures]
        _until(lambda: len(pool.pids()) == 2)
        assert victim not in pool.pids()
        later = _submit(pool, speech).result(timeout=60)
        stats = pool.stats()
    finally:
        pool.shutdown()
    words = user_words(" ".join([speech.text] * 2))
    assert all([w.word for w in timings] == words for timings in results)
    assert [w.word for w in later] == user_words(speech.text)
    assert stats["aligner_restarts"] == 1 and stats["aligner_processes"] == 2


def test_a_stopped_worker_is_timed_out_its_sentence_retried_and_the_other_never_waits(speech):
    """SIGSTOP one worker mid-alignment (timeout 1 s + 0.2 s per audio second): the other
    keeps aligning meanwhile, the stopped one is killed at its timeout and its sentence aligned
    elsewhere; nothing waits for a SIGCONT."""
    pool = _started(timeout_s=1.0)
    try:
        futures = [_submit(pool, speech) for _ in range(4)]
        stopped = _busy_worker(pool, 0).process.pid
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        done, _ = wait(futures, timeout=60)
        waited = time.monotonic() - started
        results = [future.result() for future in futures]
        _until(lambda: len(pool.pids()) == 2)
        restarts = pool.restarts
    finally:
        pool.shutdown()
    assert len(done) == 4 and all(len(r) == len(user_words(speech.text)) for r in results)
    assert waited < 20 and restarts == 1
    assert not os.path.exists(f"/proc/{stopped}")  # killed (SIGKILL ends a stopped process) and reaped


def test_a_sentence_whose_workers_die_twice_fails_alone(speech):
    pool = _started(timeout_s=5.0)
    try:
        doomed = _submit(pool, speech, repeat=8)  # a few seconds of work: time to kill it twice
        first = _busy_worker(pool, 0)
        os.kill(first.process.pid, signal.SIGKILL)
        second = _busy_worker(pool, 1)
        assert second.current.future is doomed
        os.kill(second.process.pid, signal.SIGKILL)
        with pytest.raises(AlignerFailedError, match="on two workers"):
            doomed.result(timeout=60)
        _until(lambda: len(pool.pids()) == 2)
        after = _submit(pool, speech).result(timeout=60)
    finally:
        pool.shutdown()
    assert len(after) == len(user_words(speech.text))


def test_queued_audio_is_bounded_and_overload_is_a_words_error(speech):
    """One worker taking at most 10 s of audio: a 6 s sentence is taken, the next ones are
    refused at once (the first is still waiting), and a sentence after it is done is taken."""
    pool = _started(workers=1, timeout_s=5.0, queue_s=10.0)
    try:
        taken = _submit(pool, speech)
        refused = [_submit(pool, speech) for _ in range(3)]
        waiting = pool.stats()["aligner_waiting_audio_seconds"]
        for future in refused:
            with pytest.raises(AlignerOverloadedError, match="words are skipped"):
                future.result(timeout=0)
        taken.result(timeout=60)
        later = _submit(pool, speech).result(timeout=60)
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert waiting <= 10.0 and len(later) == len(user_words(speech.text))
    assert stats["aligner_overloads"] == 3 and stats["aligner_waiting_audio_seconds"] == 0


def test_empty_audio_is_an_alignment_error_and_the_worker_aligns_on(speech):
    pool = _started(workers=1, timeout_s=5.0)
    try:
        pid = pool.pids()[0]
        for audio in (np.zeros(0, np.float32), np.zeros(10, np.float32)):
            with pytest.raises(AlignmentError, match="too short"):
                pool.submit(ALIGNER, audio, 24000, ["hello", "world"]).result(timeout=60)
        after = _submit(pool, speech).result(timeout=60)
        assert pool.pids() == [pid] and pool.restarts == 0
    finally:
        pool.shutdown()
    assert [w.word for w in after] == user_words(speech.text)


def test_a_worker_drops_an_aligner_that_failed_unexpectedly():
    """An error that is not the text's or audio's may leave the aligner broken (a decoder
    inside an utterance): the worker answers it and builds a fresh one next time."""
    class Broken:
        def align(self, audio, rate_hz, words):
            raise IndexError("out of bounds")

    aligners = {ALIGNER: Broken()}
    status, message = answer(aligners, ("align", ALIGNER, np.zeros(10, np.float32), 24000, ["a"]))
    assert (status, message) == ("error", "IndexError: out of bounds") and ALIGNER not in aligners


def test_aligner_processes_run_at_the_placement_niceness_and_cores():
    core = max(server_cpus())
    pool = AlignerPool(1, placement=WorkerPlacement(frozenset({core}), 5))
    try:
        pool.start(ALIGNER).result(timeout=120)
        pid = pool.pids()[0]
        nice = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[16])
        cpus = os.sched_getaffinity(pid)
    finally:
        pool.shutdown()
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5) and cpus == {core}
