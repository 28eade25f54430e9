"""Encoder processes: the server's CPU-heavy response encoding (mp3, aac, flac, opus, the time
stretch) in processes of their own, so that encoding never holds the server's GIL
(docs/architecture.md#encoder-processes).

Encoding inside the server process slowed its engine loop even with cores to spare: each chunk
still runs Python (frames, packets, NumPy) under the GIL the scheduler and the codec stage
need. Here the server only moves bytes: per chunk one header on the event loop, the chunks of
one loop turn in one socket write, the replies read by the same loop (audio/encode_wire.py,
server/last_mile/encoder_process.py); nothing blocks it. A stream without float stages (speed 1
at the model's rate: the common case) is sent as int16, converted here by the pipeline's own
float_to_int16, so its bytes are the ones the process would have made.

- Sticky: a response is assigned to the answering process with the fewest open responses at its
  first chunk, and its pipeline (codec state) lives there until its last (`EncoderStream`).
- Bounded: a response has at most one call in flight (its caller awaits each chunk), so a
  process's queue holds at most one chunk per response assigned to it, and the admission gate
  bounds the responses; writes wait while a socket's buffer is past WRITE_HIGH_WATER_BYTES
  (encoder_process.py).
- Failure: a process that dies (its socket reads EOF) fails its calls with `EncoderLostError`
  and is replaced; the others never notice. A response whose process is lost before any of its
  bytes has left is retried once on another process: the audio it sent is kept (a stream's until
  its first bytes, a file's until it is finished: server/last_mile/encoder_tape.py) and replayed
  there, and a file starts over with the replay's bytes (`restarts`). Past that, or when the
  retry fails too, the response fails with the error (a stream ends truncated or with an error
  event, a file is a 503 with Retry-After).
- Not answering: a process that owes a reply and has sent none for `timeout_s` (plus its
  current call's allowance, encoder_process.py) is stopped or stuck: the watchdog SIGKILLs it and
  it fails and is replaced as a dead one is. Meanwhile it gets no new response once it has been
  silent for ASSIGN_SILENCE_S (while another process answers). The timeout (--worker-timeout-s) is 200x the costliest chunk's
  work (docs/operations.md#worker-processes).
- Start-up check: a process answers READY only after opening every codec and encoding 40 ms with
  each (audio/encode_worker.py). `start()` waits for all of them: the real server (run_server)
  starts them with the engine and refuses to start without them; an app built otherwise (tests)
  starts them at its first compressed response.
- No process outlives the server: `shutdown()` closes each socket (the process exits at EOF),
  then SIGKILLs any left after STOP_TIMEOUT_S; a SIGKILLed server's processes read EOF and get
  SIGTERM from the kernel (PR_SET_PDEATHSIG, set by the process itself).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np

from higgs_serve.audio import encode_wire as wire
from higgs_serve.audio.encode_pipeline import EncodeSpec
from higgs_serve.audio.encoders.base import Patch
from higgs_serve.audio.formats import float_to_int16
from higgs_serve.config.worker_processes import DEFAULT_WORKER_TIMEOUT_S, NO_PLACEMENT, WorkerPlacement
from higgs_serve.errors import EncoderFailedError, EncoderLostError
from higgs_serve.server.last_mile.encoder_process import EncoderProcess
from higgs_serve.server.last_mile.encoder_tape import REPLAY_PIECE_S, EncoderTape

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # interpreter, NumPy, PyAV and the start-up check, on a busy host
STOP_TIMEOUT_S = 2.0  # after its socket closes, before SIGKILL
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # before the 1st, 2nd, ... replacement in a row
ASSIGN_SILENCE_S = 1.0  # at most (a quarter of the timeout when shorter): a process silent this
# long while it owes replies gets no new response
WATCH_INTERVAL_S = 1.0  # at most; a quarter of the timeout when that is shorter


class EncoderStream:
    """One response's pipeline in an encoder process. Calls go one at a time (the response
    awaits each chunk); the first assigns the process and opens the pipeline there. Its audio is
    taped while a lost process may still be replaced by another (module note)."""

    def __init__(self, pool: EncodePool, spec: EncodeSpec, stream_id: int):
        self._pool = pool
        self.spec = spec
        self.id = stream_id
        self._process: EncoderProcess | None = None
        self._busy = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of its calls
        self._loop_thread = 0
        self.closed = False
        self.released = False  # ended without a close (release)
        self._patches: list[Patch] = []
        self._tape: EncoderTape | None = EncoderTape(wire.FLOAT_DTYPE if spec.float_stages else np.int16)
        self.restarts = 0  # times its pipeline started over on another process

    async def convert(self, audio: np.ndarray, last: bool) -> bytes:
        """audio: [n] float32 at the model's rate -> the bytes ready (all of them when last).
        After a restart (`restarts` grew) the bytes are the whole output from the start."""
        if self.released:  # an earlier chunk failed (or was cancelled): so does this one
            raise EncoderFailedError("this response's encoding already failed")
        if self.closed:
            raise RuntimeError("EncoderStream used after close")
        if self._busy:
            raise RuntimeError("EncoderStream: one call at a time (await each chunk)")
        # without float stages the pipeline's first step, float_to_int16, is done here: the
        # same samples in half the bytes (the event loop's CPU is the same either way:
        # benchmarks/results/README.md, bench_encode_loop; the process's is 15 % less)
        samples = (float_to_int16(audio) if not self.spec.float_stages
                   else np.ascontiguousarray(audio, dtype=wire.FLOAT_DTYPE))
        self._busy = True
        try:
            try:
                reply = await self._call(samples, last)
            except EncoderLostError as error:
                if self._tape is None:  # its bytes have left (or it was retried): it fails
                    raise
                reply = await self._restart(samples, last, error)
        finally:
            self._busy = False
        if last:
            self.closed = True
            self._process.streams -= 1
            reply, self._patches = wire.read_close_reply(reply)
            self._drop_tape()
        elif self._tape is not None:
            self._tape.record(samples)
            if reply and not self.spec.seekable:  # these bytes leave now: no replay after them
                self._drop_tape()
        return reply

    async def _call(self, samples: np.ndarray, last: bool) -> bytes:
        """One PUSH (CLOSE when last) on the stream's process, assigned and opened at the first."""
        opening = None
        if self._process is None:
            self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
            self._process = await self._pool.assign()
            opening = self.spec.to_json()
        return await self._process.call(self.id, wire.CLOSE if last else wire.PUSH, samples,
                                        samples.size / self.spec.model_rate_hz, opening)

    async def _restart(self, samples: np.ndarray, last: bool, lost: EncoderLostError) -> bytes:
        """Its process was lost before any of its bytes left: open the pipeline again on another
        process, replay the tape, then this call; every byte from the start. Once only."""
        tape, self._tape = self._tape, None
        logger.warning("%s; retrying its response on another encoder process (%.1f s of audio "
                       "to replay)", lost, tape.samples / self.spec.model_rate_hz)
        self._process.streams -= 1
        self._process = None
        self.restarts += 1
        try:
            out = bytearray()
            for piece in tape.pieces(int(REPLAY_PIECE_S * self.spec.model_rate_hz)):
                out += await self._call(piece, last=False)
            out += await self._call(samples, last)
            return bytes(out)
        finally:
            tape.close()

    def _drop_tape(self) -> None:
        if self._tape is not None:
            self._tape.close()
            self._tape = None

    def patches(self) -> list[Patch]:
        return list(self._patches)

    def release(self) -> None:
        """The response is over without a close (failed, cancelled, its client gone): its
        process forgets its pipeline and counts it no more, now. Idempotent; the response's
        owner calls it when the response ends (server/last_mile/audio_out.py: AudioOut.release)."""
        if threading.get_ident() == self._loop_thread:
            if self._claim_release():
                self._drop()
        else:
            self.release_later()

    def release_later(self) -> None:
        """release() from any thread at any moment: the garbage collector's finalizer of a
        response nobody released. The drop runs as a callback of its own on the stream's loop,
        never inside the code the collector interrupted (a write to the same socket, say)."""
        if not self._claim_release() or self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(self._drop)
        except RuntimeError:  # the loop closed meanwhile: the pool went with it
            pass

    def _claim_release(self) -> bool:
        """True once for a stream that was assigned a process and not closed: the one caller
        that may count it down (a close counts itself down in convert)."""
        if self.closed or self._process is None:
            return False
        self.closed = self.released = True
        self._drop_tape()
        return True

    def _drop(self) -> None:
        self._process.streams -= 1
        self._process.send_drop(self.id)


class EncodePool:
    """`processes` encoder processes, started by `start()` (or by the first stream's first
    call) and stopped by `shutdown()`."""

    def __init__(self, processes: int, timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
                 placement: WorkerPlacement = NO_PLACEMENT):
        """timeout_s: how long a process that owes a reply may stay silent (see module doc);
        placement: the processes' CPU set and niceness (config/worker_processes.py)."""
        if processes < 1:
            raise ValueError(f"an encode pool needs at least one process, got {processes}")
        if timeout_s <= 0:
            raise ValueError(f"an encode pool's timeout must be positive, got {timeout_s}")
        self.size = processes
        self.timeout_s = timeout_s
        self.placement = placement
        self._processes: list[EncoderProcess] = []
        self._watchdog: asyncio.Task | None = None
        self._starting: asyncio.Task | None = None
        self._replacing: set[asyncio.Task] = set()
        self._live = asyncio.Event()
        self._next_stream = 0
        self._closing = False
        self.restarts = 0  # processes replaced after dying
        self._failures_in_a_row = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start every process and wait until each has passed its start-up check (idempotent;
        a failed start can be retried). EncoderFailedError if any cannot start."""
        if self._starting is None or (self._starting.done() and self._starting.exception()):
            self._starting = asyncio.ensure_future(self._start_all())
        await asyncio.shield(self._starting)

    async def _start_all(self) -> None:
        started = time.perf_counter()
        processes = [EncoderProcess(i, self.placement, self.process_lost) for i in range(self.size)]
        results = await asyncio.gather(*(p.start(START_TIMEOUT_S) for p in processes),
                                       return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            for process in processes:
                process.kill()
            raise failure
        self._processes = processes
        self._live.set()
        self._watchdog = asyncio.ensure_future(self._watch())
        logger.info("%d encoder process(es) ready in %.2f s (pids %s; %s)", self.size,
                    time.perf_counter() - started, ", ".join(str(p.pid) for p in processes),
                    self.placement.describe())

    async def shutdown(self) -> None:
        """Close every socket, wait up to STOP_TIMEOUT_S for the processes to exit, SIGKILL the
        rest; reaps them all."""
        self._closing = True
        for task in (*self._replacing, *([self._watchdog] if self._watchdog else [])):
            task.cancel()
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        processes, self._processes = self._processes, []
        self._live.clear()
        for process in processes:
            process.close_socket()
        for process in processes:
            if await process.reaped(STOP_TIMEOUT_S) is None:
                logger.warning("encoder process %d did not exit; killing it", process.pid)
                process.kill()
                process.popen.wait()

    # ------------------------------------------------------------------ streams
    def open(self, spec: EncodeSpec) -> EncoderStream:
        """A response's pipeline (assigned to a process at its first chunk)."""
        self._next_stream = (self._next_stream + 1) & 0xFFFFFFFF
        return EncoderStream(self, spec, self._next_stream)

    async def assign(self) -> EncoderProcess:
        """The live process with the fewest open streams (one more is counted on it)."""
        if self._closing:
            raise EncoderFailedError("the server is shutting down its encoder processes")
        if not self._processes:  # the first stream (lazy start), or a failed start retried
            await self.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (live := [p for p in self._processes if p.alive]):  # all being replaced
            self._live.clear()
            try:
                await asyncio.wait_for(self._live.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise EncoderFailedError("no encoder process is running") from None
        now, silence_s = time.monotonic(), min(ASSIGN_SILENCE_S, self.timeout_s / 4)
        answering = [p for p in live if p.silent_s(now) < silence_s] or live
        process = min(answering, key=lambda p: p.streams)
        process.streams += 1
        return process

    # ------------------------------------------------------------------ failures
    def process_lost(self, process: EncoderProcess, calls_failed: int) -> None:
        """A live process's socket closed: its responses have failed; replace it."""
        if process not in self._processes:
            return
        if not any(p.alive for p in self._processes):
            self._live.clear()
        if self._closing:
            return
        task = asyncio.ensure_future(self._replace(process, calls_failed))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _watch(self) -> None:
        """Kill each process that owes a reply and has been silent past its patience."""
        interval = min(WATCH_INTERVAL_S, self.timeout_s / 4)
        while not self._closing:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for process in list(self._processes):
                silent = process.silent_s(now)
                if process.alive and silent > process.patience_s(self.timeout_s):
                    process.wedged(silent)

    async def _replace(self, dead: EncoderProcess, calls_failed: int) -> None:
        status = await dead.reaped(1.0)
        logger.error("encoder process %d exited (status %s) with %d response(s) assigned, %d "
                     "mid-chunk: they end with an error; starting a replacement", dead.pid,
                     status, dead.streams, calls_failed)
        while not self._closing:
            delay = RESTART_BACKOFF_S[min(self._failures_in_a_row, len(RESTART_BACKOFF_S) - 1)]
            await asyncio.sleep(delay)
            fresh = EncoderProcess(dead.index, self.placement, self.process_lost)
            try:
                await fresh.start(START_TIMEOUT_S)
            except EncoderFailedError as error:
                self._failures_in_a_row += 1
                logger.error("replacing encoder process %d failed: %s", dead.pid, error)
                continue
            except OSError as error:  # fork or socket failure
                self._failures_in_a_row += 1
                logger.error("replacing encoder process %d failed: %s", dead.pid, error)
                continue
            if self._closing:
                fresh.kill()
                return
            self._failures_in_a_row = 0
            self._processes[self._processes.index(dead)] = fresh
            self.restarts += 1
            self._live.set()
            logger.info("encoder process %d replaced by %d", dead.pid, fresh.pid)
            return

    # ------------------------------------------------------------------ observing
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.alive]

    def stats(self) -> dict[str, float]:
        return {"encoder_processes": float(sum(p.alive for p in self._processes)),
                "encoder_restarts": float(self.restarts),
                "encoder_streams": float(sum(p.streams for p in self._processes))}
