"""One aligner process as the pool sees it (alignment/pool.py; the process itself is
alignment/worker.py): the process, its queue, and the thread that feeds it one request at a
time and waits for the answer within its patience (docs/operations.md#worker-processes).

The thread is the only user of the process and its connection; the queue and the counts are
shared with the pool under the pool's lock. A request's patience is the pool's timeout plus
ALLOWANCE_S_PER_AUDIO_S per second of its audio (START_TIMEOUT_S to start and load a model);
sends and receives wait at most the timeout too (the socket's own timeouts), so a stopped
process cannot hold the thread. Past it, or at EOF, the process is SIGKILLed (one log line),
the pool is told (`finished(..., "lost", ...)`) and a replacement starts at once.
"""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

import numpy as np

from higgs_serve.alignment.aligner import WordTiming
from higgs_serve.config.worker_processes import WorkerPlacement, spawn_worker
from higgs_serve.errors import AlignerFailedError, AlignmentError

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # interpreter, PocketSphinx and its model, on a busy host
STOP_TIMEOUT_S = 2.0  # after SIGTERM at shutdown, before SIGKILL
# 4x PocketSphinx's measured cost at its worst (0.053 CPU-s per audio-s on a busy host, issue 54;
# 0.02 alone: benchmarks/results/alignment_accuracy.json); the timeout absorbs the host's load
ALLOWANCE_S_PER_AUDIO_S = 0.2
EXPECTED_S_PER_AUDIO_S = 0.1  # an alignment running longer than this (+ ASSIGN_SILENCE_S) is late
ASSIGN_SILENCE_S = 1.0  # at most; a quarter of the timeout when that is shorter
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # before the 1st, 2nd, ... start in a row


class AlignerHost(Protocol):
    """What an AlignerProcess needs of its pool (alignment/pool.py's AlignerPool)."""

    lock: threading.Lock
    closing: bool
    timeout_s: float
    placement: WorkerPlacement

    def finished(self, worker: AlignerProcess, job: AlignJob, kind: str, value) -> None: ...

    def warm_names(self) -> list[str]: ...


@dataclass(eq=False)
class AlignJob:
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


class Lost(Exception):
    """The process died or stopped answering under a request."""


class AlignerProcess:
    """One aligner process, its queue and the thread that feeds it (the only user of its
    process and connection; the queue is shared under the pool's lock)."""

    def __init__(self, pool: AlignerHost, index: int):
        self.pool = pool
        self.index = index
        self.queue: deque[AlignJob] = deque()
        self.waiting_s = 0.0  # audio of the queued jobs and the one in flight
        self.current: AlignJob | None = None
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

    def put(self, job: AlignJob) -> None:
        self.queue.append(job)
        self.waiting_s += job.audio_s
        self.wake.notify()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                outcome = ("ok", self._work(job))
            except Lost as lost:
                outcome = ("lost", str(lost))
            except (AlignmentError, OSError) as error:
                outcome = ("error", error)
            self.pool.finished(self, job, *outcome)
            if outcome[0] == "lost" and not self.pool.closing:
                self._up()  # the replacement, now: it takes work again once its models load
        self._stop_process()

    def _next(self) -> AlignJob | None:
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

    def _work(self, job: AlignJob) -> list[WordTiming] | None:
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
        """The process's answer to `request`; AlignmentError for its error answer, Lost when
        it dies or answers nothing within patience_s (it is killed then)."""
        try:
            self.connection.send(request)  # a stopped process: times out (SO_SNDTIMEO)
            if not self.connection.poll(patience_s):
                self._kill(f"answered nothing for {patience_s:.1f} s")
                raise Lost("stopped answering")
            status, value = self.connection.recv()
        except (EOFError, OSError) as error:
            self._kill(f"stopped ({type(error).__name__})")
            raise Lost("stopped") from None
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
        except (OSError, EOFError, Lost, AlignmentError) as error:  # TimeoutError is an OSError
            self.starts_failed += 1
            logger.error("starting aligner process %d failed: %s", self.index, error)
            self._stop_process()
            return False
        self.starts_failed = 0
        with self.pool.lock:
            self.answering = True
        return True

    def _start_process(self) -> None:
        self.process, ours = spawn_worker("higgs_serve.alignment.worker", self.pool.placement)
        # writes and reads that wait past the timeout fail (a stopped process)
        seconds = self.pool.timeout_s
        limit = struct.pack("ll", int(seconds), max(1000, int(seconds % 1 * 1e6)))
        try:
            for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):
                ours.setsockopt(socket.SOL_SOCKET, option, limit)
        except BaseException:
            ours.close()  # the caller stops the process
            raise
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
