"""Aligner processes: alignment runs there, never on the caller's thread
(docs/api.md#word-timestamps, docs/operations.md#worker-processes).

Why processes: PocketSphinx holds the GIL for the whole decode (20-53 ms of CPU per second of
audio, benchmarks/results/alignment_accuracy.json), so in a thread it would stall the server's
event loop and the engine's threads alike. Each process (alignment/worker.py) builds the
aligners it is asked for once and keeps them.

Independent workers: each process has its own queue and its own feeding thread here, so one
that dies or stops answering costs only its own work:
- Assignment: a sentence goes to the answering worker with the least audio waiting (queued and
  in flight). A worker whose current alignment has run ASSIGN_SILENCE_S past its expected cost
  gets no new work while another answers.
- Bounded memory: a worker takes at most `queue_s` seconds of audio (it always takes one
  sentence when it has none); past that the sentence fails at once with AlignerOverloadedError,
  a words error its response reports (its audio is unaffected). The pool holds at most
  `workers x queue_s` seconds of audio (0.1 MB a second) plus one sentence a worker.
- Not answering: an alignment gets `timeout_s` plus ALLOWANCE_S_PER_AUDIO_S per second of its
  audio (sends and receives too, through the socket's own timeouts). Past it, or when the
  process dies, the process is SIGKILLed (one log line) and replaced at once; the alignment it
  was on is retried once on another worker (its replacement when there is none) and fails with
  AlignerFailedError the second time; its queued sentences move to the other workers.
- Start-up: a worker starts its process at its first work; the model of each aligner named by
  `start`/`warm` loads before the process takes a sentence (START_TIMEOUT_S), in every process
  and again in each replacement.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from higgs_serve.alignment.aligner import WordTiming
from higgs_serve.config.worker_processes import NO_PLACEMENT, WorkerPlacement
from higgs_serve.errors import AlignerFailedError, AlignerOverloadedError, AlignmentError

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # interpreter, PocketSphinx and its model, on a busy host
STOP_TIMEOUT_S = 2.0  # after SIGTERM at shutdown, before SIGKILL
DEFAULT_TIMEOUT_S = 10.0  # ServerSettings.worker_timeout_s
DEFAULT_QUEUE_S = 120.0  # ServerSettings.alignment_queue_s
# 10x PocketSphinx's measured cost at its worst (0.053 CPU-s per audio-s): a niced process on a
# busy host is slow, not wedged
ALLOWANCE_S_PER_AUDIO_S = 0.5
EXPECTED_S_PER_AUDIO_S = 0.1  # an alignment running longer than this (+ ASSIGN_SILENCE_S) is late
ASSIGN_SILENCE_S = 1.0  # at most; a quarter of the timeout when that is shorter
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # before the 1st, 2nd, ... start in a row


@dataclass(eq=False)
class _Job:
    name: str  # the aligner
    future: Future
    audio: np.ndarray | None = None  # None: load the aligner only (start/warm)
    rate_hz: int = 1
    words: list[str] | None = None
    tries: int = 0  # workers that died or went silent under it

    @property
    def audio_s(self) -> float:
        return 0.0 if self.audio is None else len(self.audio) / self.rate_hz

    def request(self) -> tuple:
        if self.audio is None:
            return ("build", self.name)
        return ("align", self.name, self.audio, self.rate_hz, self.words)


class _Lost(Exception):
    """The process died or stopped answering under a request."""


class _Worker:
    """One aligner process, its queue and the thread that feeds it (the only user of its
    process and connection; the queue is shared under the pool's lock)."""

    def __init__(self, pool: AlignerPool, index: int):
        self.pool = pool
        self.index = index
        self.queue: deque[_Job] = deque()
        self.waiting_s = 0.0  # audio of the queued jobs and the one in flight
        self.current: _Job | None = None
        self.current_since = 0.0
        self.answering = True  # False from a kill until its replacement is up
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None
        self.built: set[str] = set()
        self.starts_failed = 0
        self.wake = threading.Condition(pool.lock)
        self.thread = threading.Thread(target=self._run, name=f"higgs-aligner-{index}", daemon=True)

    # ------------------------------------------------------------------ under the pool's lock
    def late(self, now: float) -> bool:
        job = self.current
        if job is None:
            return False
        return now - self.current_since > (min(ASSIGN_SILENCE_S, self.pool.timeout_s / 4)
                                           + EXPECTED_S_PER_AUDIO_S * job.audio_s)

    def put(self, job: _Job) -> None:
        self.queue.append(job)
        self.waiting_s += job.audio_s
        self.wake.notify()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                outcome = ("ok", self._work(job))
            except _Lost as lost:
                outcome = ("lost", str(lost))
            except (AlignmentError, OSError) as error:
                outcome = ("error", error)
            self.pool.finished(self, job, *outcome)
            if outcome[0] == "lost" and not self.pool.closing:
                self._up()  # the replacement, now: it takes work again once its models load
        self._stop_process()

    def _next(self) -> _Job | None:
        with self.pool.lock:
            while True:
                while not self.queue and not self.pool.closing:
                    self.wake.wait()
                if self.pool.closing:
                    return None
                job = self.queue.popleft()
                if job.tries or job.future.set_running_or_notify_cancel():
                    self.current, self.current_since = job, time.monotonic()
                    return job
                self.waiting_s -= job.audio_s  # cancelled while queued (its response ended)

    def _work(self, job: _Job) -> list[WordTiming] | None:
        if not self._up():
            raise AlignerFailedError("no aligner process could be started (see the server log)")
        if job.name not in self.built:
            self._ask(("build", job.name), START_TIMEOUT_S)
            self.built.add(job.name)
        if job.audio is None:
            return None
        with self.pool.lock:
            self.current_since = time.monotonic()  # the model was loading: not its own time
        return self._ask(job.request(), self.pool.timeout_s + ALLOWANCE_S_PER_AUDIO_S * job.audio_s)

    def _ask(self, request: tuple, patience_s: float):
        """The process's answer to `request`; AlignmentError for its error answer, _Lost when
        it dies or answers nothing within patience_s (it is killed then)."""
        try:
            self.connection.send(request)  # a stopped process: times out (SO_SNDTIMEO)
            if not self.connection.poll(patience_s):
                self._kill(f"answered nothing for {patience_s:.1f} s")
                raise _Lost("stopped answering")
            status, value = self.connection.recv()
        except (EOFError, OSError) as error:
            self._kill(f"stopped ({type(error).__name__})")
            raise _Lost("stopped") from None
        if status != "ok":
            raise AlignmentError(value)
        return value

    def _up(self) -> bool:
        """Its process is running and has loaded the pool's aligners (started now if not,
        after the backoff of earlier failed starts); False when none could be started."""
        if self.process is not None:
            return True
        if self.pool.closing:
            return False
        time.sleep(RESTART_BACKOFF_S[min(self.starts_failed, len(RESTART_BACKOFF_S) - 1)])
        try:
            self._start_process()
            for name in self.pool.warm_names():
                self._ask(("build", name), START_TIMEOUT_S)
                self.built.add(name)
        except (OSError, EOFError, _Lost, AlignmentError) as error:  # TimeoutError is an OSError
            self.starts_failed += 1
            logger.error("starting aligner process %d failed: %s", self.index, error)
            self._stop_process()
            return False
        self.starts_failed = 0
        with self.pool.lock:
            self.answering = True
        return True

    def _start_process(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # writes and reads that wait past the timeout fail (a stopped process)
            seconds = self.pool.timeout_s
            limit = struct.pack("ll", int(seconds), max(1000, int(seconds % 1 * 1e6)))
            for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):
                ours.setsockopt(socket.SOL_SOCKET, option, limit)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "higgs_serve.alignment.worker", "--fd", str(theirs.fileno()),
                 "--parent-pid", str(os.getpid()), *self.pool.placement.to_args()],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())
        if not self.connection.poll(START_TIMEOUT_S):
            raise TimeoutError(f"aligner process {self.process.pid} did not start within "
                               f"{START_TIMEOUT_S:.0f} s")
        self.connection.recv()  # ("ready", pid)

    def _kill(self, why: str) -> None:
        with self.pool.lock:
            self.answering = False
            queued = len(self.queue)
        if not self.pool.closing:
            logger.error("aligner process %d %s with %d sentence(s) queued: killing it, its "
                         "sentences go to the other workers", self.process.pid, why, queued)
        self._stop_process(kill=True)

    def _stop_process(self, kill: bool = False) -> None:
        process, connection = self.process, self.connection
        self.process, self.connection, self.built = None, None, set()
        if connection is not None:
            connection.close()  # EOF: the process exits
        if process is not None:
            if kill:
                process.kill()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class AlignerPool:
    """`workers` aligner processes, each started at its first work (or `start`)."""

    def __init__(self, workers: int, timeout_s: float = DEFAULT_TIMEOUT_S,
                 queue_s: float = DEFAULT_QUEUE_S, placement: WorkerPlacement = NO_PLACEMENT):
        """timeout_s and queue_s: see the module doc; placement: the processes' CPU set and
        niceness (config/worker_processes.py)."""
        if workers < 1:
            raise ValueError(f"aligner workers must be at least 1, got {workers}")
        if timeout_s <= 0 or queue_s <= 0:
            raise ValueError(f"an aligner pool's timeout and queue must be positive, got "
                             f"{timeout_s} and {queue_s}")
        self.workers = workers
        self.timeout_s = timeout_s
        self.queue_s = queue_s
        self.placement = placement
        self.lock = threading.Lock()
        self.closing = False
        self.restarts = 0  # processes killed (died or silent) and replaced
        self.overloads = 0  # sentences refused because every worker was full
        self._warm: list[str] = []
        self._workers: list[_Worker] = []

    # ------------------------------------------------------------------ work in
    def submit(self, name: str, audio: np.ndarray, sample_rate_hz: int,
               words: list[str]) -> Future[list[WordTiming]]:
        """Queue one alignment; the future holds the timings or an AlignmentError (the
        aligner's, AlignerOverloadedError, AlignerFailedError)."""
        job = _Job(name, Future(), audio, sample_rate_hz, words)
        with self.lock:
            worker = self._pick(exclude=None)
            if worker.waiting_s and worker.waiting_s + job.audio_s > self.queue_s:
                self.overloads += 1
                behind = sum(w.waiting_s for w in self._workers)
                job.future.set_exception(AlignerOverloadedError(
                    f"the aligner processes are {behind:.0f} s of audio behind (at most "
                    f"{self.queue_s:.0f} s each): this sentence's words are skipped"))
            else:
                worker.put(job)
        return job.future

    def start(self, name: str) -> Future[None]:
        """Start every worker's process and load aligner `name` in each (also in later
        replacements), so the first real request does not wait for the model to load."""
        done: Future[None] = Future()
        with self.lock:
            if name not in self._warm:
                self._warm.append(name)
            self._ensure_workers()
            jobs = [_Job(name, Future()) for _ in self._workers]
            for worker, job in zip(self._workers, jobs):
                worker.put(job)
        left, errors = [len(jobs)], []

        def one_done(future: Future) -> None:
            with self.lock:
                left[0] -= 1
                if not future.cancelled() and future.exception() is not None:
                    errors.append(future.exception())
                last = left[0] == 0
            if last and errors:
                done.set_exception(errors[0])
            elif last:
                done.set_result(None)

        for job in jobs:
            job.future.add_done_callback(one_done)
        return done

    def warm(self, name: str) -> None:
        """`start(name)` once per aligner, without waiting: called when a request asking for
        timestamps is planned, so the model loads while its first sentence is spoken."""
        with self.lock:
            if name in self._warm:
                return
        self.start(name)

    def warm_names(self) -> list[str]:
        with self.lock:
            return list(self._warm)

    def _ensure_workers(self) -> None:
        if not self._workers:
            self._workers = [_Worker(self, i) for i in range(self.workers)]
            for worker in self._workers:
                worker.thread.start()

    def _pick(self, exclude: _Worker | None) -> _Worker:
        """The answering worker with the least audio waiting (any worker when none answers)."""
        self._ensure_workers()
        now = time.monotonic()
        others = [w for w in self._workers if w is not exclude] or self._workers
        answering = [w for w in others if w.answering and not w.late(now)] or others
        return min(answering, key=lambda w: w.waiting_s)

    # ------------------------------------------------------------------ work out
    def finished(self, worker: _Worker, job: _Job, kind: str, value) -> None:
        """A worker's thread is done with `job`: ok (value: the timings), error (value: the
        AlignmentError) or lost (value: why; the process was killed)."""
        with self.lock:
            worker.current = None
            worker.waiting_s -= job.audio_s
            if kind == "lost":
                self.restarts += 1
                self._move_queue(worker)
                if job.tries == 0 and job.audio is not None and not self.closing:
                    job.tries = 1
                    self._pick(exclude=worker).put(job)  # the retry: never refused as overload
                    return
        if kind == "ok":
            job.future.set_result(value)
        elif kind == "error":
            job.future.set_exception(value if isinstance(value, AlignmentError)
                                     else AlignmentError(str(value)))
        else:
            job.future.set_exception(AlignerFailedError(
                "the shutdown stopped this alignment" if self.closing else
                f"the aligner process {value} under this sentence, on two workers"))

    def _move_queue(self, worker: _Worker) -> None:
        """A killed worker's queued sentences (never started) go to the answering others."""
        others = [w for w in self._workers if w is not worker and w.answering]
        while others and worker.queue:
            job = worker.queue.popleft()
            worker.waiting_s -= job.audio_s
            min(others, key=lambda w: w.waiting_s).put(job)

    # ------------------------------------------------------------------ observing, ending
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None]

    def stats(self) -> dict[str, float]:
        with self.lock:
            return {"aligner_processes": float(sum(w.process is not None for w in self._workers)),
                    "aligner_restarts": float(self.restarts),
                    "aligner_waiting_audio_seconds": sum(w.waiting_s for w in self._workers),
                    "aligner_overloads": float(self.overloads)}

    def shutdown(self) -> None:
        """Cancel what is queued, stop every process (SIGTERM, SIGKILL after STOP_TIMEOUT_S)
        and join the threads."""
        with self.lock:
            self.closing = True
            queued = [job for w in self._workers for job in w.queue]
            for worker in self._workers:
                worker.queue.clear()
                worker.wake.notify_all()
        for job in queued:
            if not job.future.cancel():  # a retry (already running): fail it
                job.future.set_exception(AlignerFailedError("the server is shutting down"))
        for worker in self._workers:
            process = worker.process
            if process is not None and process.poll() is None:
                process.terminate()  # a thread waiting on it reads EOF
        for worker in self._workers:
            worker.thread.join(STOP_TIMEOUT_S + 1.0)
