"""Encoder processes: the server's CPU-heavy response encoding (mp3, aac, flac, opus, the time
stretch) in processes of their own, so that encoding never holds the server's GIL
(docs/architecture.md#encoder-processes).

Encoding inside the server process slowed its engine loop even with cores to spare: each chunk
still runs Python (frames, packets, NumPy) under the GIL the scheduler and the codec stage
need. Here the server only moves bytes: per chunk one header and one socket write on the event
loop, one reply read by the same loop (audio/encode_wire.py); nothing blocks it.

- Sticky: a response is assigned to the process with the fewest open responses at its first
  chunk, and its pipeline (codec state) lives there until its last (`EncoderStream`).
- Bounded: a response has at most one call in flight (its caller awaits each chunk), so a
  process's queue holds at most one chunk per response assigned to it, and the admission gate
  bounds the responses; writes wait while a socket's buffer is past WRITE_HIGH_WATER_BYTES.
- Failure: a process that dies (its socket reads EOF) fails the calls and the later chunks of
  its own responses with `EncoderFailedError` (a stream ends truncated or with an error event, a
  file is a 500) and is replaced; the others never notice.
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
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from higgs_serve.audio import encode_wire as wire
from higgs_serve.audio.encode_pipeline import EncodeSpec
from higgs_serve.audio.encoders.base import Patch
from higgs_serve.errors import EncoderFailedError

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # interpreter, NumPy, PyAV and the start-up check, on a busy host
STOP_TIMEOUT_S = 2.0  # after its socket closes, before SIGKILL
WRITE_HIGH_WATER_BYTES = 4 << 20  # a process's unsent calls past which writers wait
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # before the 1st, 2nd, ... replacement in a row
_REAP_POLL_S = 0.01


class _Connection(asyncio.Protocol):
    """The server's end of one process's socket: replies parsed as they arrive and handed to
    the process's waiting calls."""

    def __init__(self, process: EncoderProcess):
        self._process = process
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        with memoryview(buffer) as view:
            while len(buffer) - at >= wire.REPLY.size:
                call_id, status, size = wire.REPLY.unpack_from(buffer, at)
                end = at + wire.REPLY.size + size
                if len(buffer) < end:
                    break
                self._process.answered(call_id, status, bytes(view[at + wire.REPLY.size:end]))
                at = end
        del buffer[:at]

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()  # writers wake and find the process gone
        self._process.lost()


class EncoderProcess:
    """One encoder process: its Popen, its socket, the calls waiting for their replies and the
    streams (responses) assigned to it."""

    def __init__(self, pool: EncodePool, index: int):
        self._pool = pool
        self.index = index
        self.popen: subprocess.Popen | None = None
        self._connection: _Connection | None = None
        self._ready: asyncio.Future | None = None
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = wire.READY_CALL_ID + 1
        self.streams = 0  # responses assigned and not yet closed or dropped
        self.alive = False
        self.report: dict = {}

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    async def start(self, timeout_s: float) -> None:
        """Spawn the process and wait for its READY (its start-up check passed)."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # from the event loop's thread: the process's PR_SET_PDEATHSIG watches this thread,
            # which lives as long as the server
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "higgs_serve.audio.encode_worker", "--fd", str(theirs.fileno()),
                 "--parent-pid", str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ready = loop.create_future()
        self._connection = _Connection(self)
        await loop.create_connection(lambda: self._connection, sock=ours)
        try:
            payload = await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except TimeoutError:
            self.kill()
            raise EncoderFailedError(f"an encoder process (pid {self.pid}) did not start within "
                                     f"{timeout_s:.0f} s") from None
        except BaseException:
            self.kill()
            raise
        self.report = json.loads(payload)
        self.alive = True

    def answered(self, call_id: int, status: int, payload: bytes) -> None:
        if call_id == wire.READY_CALL_ID:
            if status == wire.OK:
                self._ready.set_result(payload)
            else:
                self._ready.set_exception(EncoderFailedError(
                    f"an encoder process failed its start-up check: {payload.decode(errors='replace')}"))
            return
        future = self._calls.pop(call_id, None)
        if future is None or future.done():  # its caller was cancelled (the client left)
            return
        if status == wire.OK:
            future.set_result(payload)
        else:
            future.set_exception(EncoderFailedError(
                f"encoder process {self.pid}: {payload.decode(errors='replace')}"))

    def lost(self) -> None:
        """The socket closed: the process exited (or is exiting). Fail what waits on it."""
        was_alive, self.alive = self.alive, False
        error = EncoderFailedError(f"the encoder process (pid {self.pid}) of this response stopped")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EncoderFailedError(
                f"an encoder process (pid {self.pid}) exited during its start-up check"))
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(error)
        if was_alive:
            self._pool.process_lost(self, len(calls))

    async def call(self, stream_id: int, op: int, audio: np.ndarray | None,
                   opening: EncodeSpec | None = None) -> bytes:
        """One PUSH or CLOSE (preceded, in the same write, by the stream's OPEN): the reply's
        payload, or EncoderFailedError."""
        connection = self._connection
        while not connection.writable.is_set():  # backpressure: the process is behind
            await connection.writable.wait()
        if not self.alive:
            raise EncoderFailedError(f"the encoder process (pid {self.pid}) of this response stopped")
        parts = []
        if opening is not None:
            spec = opening.to_json()
            parts += [wire.CALL.pack(0, stream_id, wire.OPEN, len(spec)), spec]
        samples = np.ascontiguousarray(audio, dtype=wire.SAMPLE_DTYPE)
        call_id = self._next_call
        self._next_call = call_id % 0xFFFFFFFF + 1  # never READY_CALL_ID
        parts += [wire.CALL.pack(call_id, stream_id, op, samples.nbytes), samples.data]
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        connection.transport.writelines(parts)
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def send_drop(self, stream_id: int) -> None:
        if self.alive:
            self._connection.transport.write(wire.CALL.pack(0, stream_id, wire.DROP, 0))

    def close_socket(self) -> None:
        """EOF to the process: it finishes the call it is on and exits."""
        self.alive = False
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()

    def kill(self) -> None:
        """SIGKILL and reap (a killed process exits at once)."""
        self.alive = False
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.abort()

    async def reaped(self, timeout_s: float) -> int | None:
        """The exit status once the process has exited (None if it is still running)."""
        deadline = time.monotonic() + timeout_s
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(_REAP_POLL_S)
        return self.popen.returncode


class EncoderStream:
    """One response's pipeline in an encoder process. Calls go one at a time (the response
    awaits each chunk); the first assigns the process and opens the pipeline there."""

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

    async def convert(self, audio: np.ndarray, last: bool) -> bytes:
        """audio: [n] float32 at the model's rate -> the bytes ready (all of them when last)."""
        if self.released:  # an earlier chunk failed (or was cancelled): so does this one
            raise EncoderFailedError("this response's encoding already failed")
        if self.closed:
            raise RuntimeError("EncoderStream used after close")
        if self._busy:
            raise RuntimeError("EncoderStream: one call at a time (await each chunk)")
        self._busy = True
        try:
            opening = None
            if self._process is None:
                self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
                self._process = await self._pool.assign()
                opening = self.spec
            op = wire.CLOSE if last else wire.PUSH
            reply = await self._process.call(self.id, op, audio, opening)
        finally:
            self._busy = False
        if last:
            self.closed = True
            self._process.streams -= 1
            reply, self._patches = wire.read_close_reply(reply)
        return reply

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
        return True

    def _drop(self) -> None:
        self._process.streams -= 1
        self._process.send_drop(self.id)


class EncodePool:
    """`processes` encoder processes, started by `start()` (or by the first stream's first
    call) and stopped by `shutdown()`."""

    def __init__(self, processes: int):
        if processes < 1:
            raise ValueError(f"an encode pool needs at least one process, got {processes}")
        self.size = processes
        self._processes: list[EncoderProcess] = []
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
        processes = [EncoderProcess(self, i) for i in range(self.size)]
        results = await asyncio.gather(*(p.start(START_TIMEOUT_S) for p in processes),
                                       return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            for process in processes:
                process.kill()
            raise failure
        self._processes = processes
        self._live.set()
        logger.info("%d encoder process(es) ready in %.2f s (pids %s)", self.size,
                    time.perf_counter() - started, ", ".join(str(p.pid) for p in processes))

    async def shutdown(self) -> None:
        """Close every socket, wait up to STOP_TIMEOUT_S for the processes to exit, SIGKILL the
        rest; reaps them all."""
        self._closing = True
        for task in self._replacing:
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
        process = min(live, key=lambda p: p.streams)
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

    async def _replace(self, dead: EncoderProcess, calls_failed: int) -> None:
        status = await dead.reaped(1.0)
        logger.error("encoder process %d exited (status %s) with %d response(s) assigned, %d "
                     "mid-chunk: they end with an error; starting a replacement", dead.pid,
                     status, dead.streams, calls_failed)
        while not self._closing:
            delay = RESTART_BACKOFF_S[min(self._failures_in_a_row, len(RESTART_BACKOFF_S) - 1)]
            await asyncio.sleep(delay)
            fresh = EncoderProcess(self, dead.index)
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
