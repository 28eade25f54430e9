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
  (aligner_process.py) gets no new work while another answers.
- Bounded memory: a worker takes at most `queue_s` seconds of audio (it always takes one
  sentence when it has none); past that the sentence fails at once with AlignerOverloadedError,
  a words error its response reports (its audio is unaffected). The pool holds at most
  `workers x queue_s` seconds of audio (0.1 MB a second) plus one sentence a worker.
- Not answering: an alignment gets `timeout_s` plus ALLOWANCE_S_PER_AUDIO_S per second of its
  audio (aligner_process.py; sends and receives too, through the socket's own timeouts). Past it, or when the
  process dies, the process is SIGKILLed (one log line) and replaced at once; the alignment it
  was on is retried once on another worker (its replacement when there is none) and fails with
  AlignerFailedError the second time; its queued sentences move to the other workers.
- Start-up: a worker starts its process at its first work; the model of each aligner named by
  `start`/`warm` loads before the process takes a sentence (START_TIMEOUT_S), in every process
  and again in each replacement.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np

from higgs_serve.alignment.aligner import WordTiming
from higgs_serve.alignment.aligner_process import STOP_TIMEOUT_S, AlignerProcess, AlignJob
from higgs_serve.config.worker_processes import DEFAULT_WORKER_TIMEOUT_S, NO_PLACEMENT, WorkerPlacement
from higgs_serve.errors import AlignerFailedError, AlignerOverloadedError, AlignmentError

# ServerSettings.alignment_queue_s: audio that may wait for one process, 0.1 MB a second of it
# (24 kHz float32); 2.4-6.4 s of its work at 0.02-0.053 CPU-s per audio second
DEFAULT_QUEUE_S = 120.0


class AlignerPool:
    """`workers` aligner processes, each started at its first work (or `start`)."""

    def __init__(self, workers: int, timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
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
        self._workers: list[AlignerProcess] = []

    # ------------------------------------------------------------------ work in
    def submit(self, name: str, audio: np.ndarray, sample_rate_hz: int,
               words: list[str]) -> Future[list[WordTiming]]:
        """Queue one alignment; the future holds the timings or an AlignmentError (the
        aligner's, AlignerOverloadedError, AlignerFailedError)."""
        job = AlignJob(name, Future(), audio, sample_rate_hz, words)
        with self.lock:
            if self.closing:
                job.future.set_exception(AlignerFailedError("the server is shutting down"))
                return job.future
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
            if self.closing:
                done.set_exception(AlignerFailedError("the server is shutting down"))
                return done
            if name not in self._warm:
                self._warm.append(name)
            self._ensure_workers()
            jobs = [AlignJob(name, Future()) for _ in self._workers]
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
            self._workers = [AlignerProcess(self, i) for i in range(self.workers)]
            for worker in self._workers:
                worker.thread.start()

    def _pick(self, exclude: AlignerProcess | None) -> AlignerProcess:
        """The answering worker with the least audio waiting (any worker when none answers)."""
        self._ensure_workers()
        now = time.monotonic()
        others = [w for w in self._workers if w is not exclude] or self._workers
        answering = [w for w in others if w.answering and not w.late(now)] or others
        return min(answering, key=lambda w: w.waiting_s)

    # ------------------------------------------------------------------ work out
    def finished(self, worker: AlignerProcess, job: AlignJob, kind: str, value) -> None:
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

    def _move_queue(self, worker: AlignerProcess) -> None:
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
