"""One encoder process as the server sees it: its Popen, its socket, the calls owed a reply
(docs/architecture.md#encoder-processes; the pool is encode_pool.py, the process itself
audio/encode_worker.py, their messages audio/encode_wire.py).

- Batched writes: a call is queued and the queue written once per turn of the event loop, so
  the chunks several responses push after one engine step cost one socket write (with the
  process's batched replies, 20-25 % less event-loop CPU per audio second for mp3 at K = 256:
  benchmarks/results/README.md, bench_encode_loop).
- Answering: replies come in call order, so a process that owes replies and has sent none for
  longer than one call can take is not answering (`silent_s`, `patience_s`): the pool's
  watchdog then kills it (`wedged`), which fails its calls like a death does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from higgs_serve.audio import encode_wire as wire
from higgs_serve.config.worker_processes import WorkerPlacement, spawn_worker
from higgs_serve.errors import EncoderFailedError, EncoderLostError

logger = logging.getLogger(__name__)

WRITE_HIGH_WATER_BYTES = 4 << 20  # a process's unsent calls past which writers wait
# One call's work allowance on top of the pool's timeout, per second of audio in it (a file's
# audio can come in one chunk): twice the costliest pipeline measured, mp3 at 44.1 kHz with the
# time stretch at speed 0.5 (0.051 CPU-s per audio-s on the 2-core CI host; aac at 24 kHz
# 0.009-0.017: benchmarks/results/encoders_cpu.json). The timeout itself absorbs a busy host.
CALL_ALLOWANCE_S_PER_AUDIO_S = 0.1
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


@dataclass
class _Call:
    future: asyncio.Future
    audio_s: float  # the audio it carries: its share of the patience


class EncoderProcess:
    """One encoder process: its Popen, its socket, the calls waiting for their replies and the
    streams (responses) assigned to it."""

    def __init__(self, index: int, placement: WorkerPlacement,
                 on_lost: Callable[[EncoderProcess, int], None]):
        """on_lost(process, calls failed): a live process's socket closed or it was killed for
        not answering (its pool replaces it)."""
        self._on_lost = on_lost
        self.index = index
        self._placement = placement
        self.popen: subprocess.Popen | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, where it was started
        self._connection: _Connection | None = None
        self._ready: asyncio.Future | None = None
        self._calls: dict[int, _Call] = {}  # in call order: the first is the one being encoded
        self._next_call = wire.READY_CALL_ID + 1
        self._outbox: list[bytes | memoryview] = []  # calls of this loop turn, written together
        self._answered_at = 0.0  # monotonic: its last reply, or the call that ended an idle spell
        self.streams = 0  # responses assigned and not yet closed or dropped
        self.alive = False
        self.report: dict = {}

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    async def start(self, timeout_s: float) -> None:
        """Spawn the process and wait for its READY (its start-up check passed)."""
        loop = asyncio.get_running_loop()
        # from the event loop's thread: the process's PR_SET_PDEATHSIG watches this thread,
        # which lives as long as the server
        self.popen, ours = spawn_worker("higgs_serve.audio.encode_worker", self._placement)
        self._loop = loop
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

    # ------------------------------------------------------------------ calls
    async def call(self, stream_id: int, op: int, samples: np.ndarray, audio_s: float,
                   opening: bytes | None = None) -> bytes:
        """One PUSH or CLOSE (preceded, in the same write, by the stream's OPEN spec): the
        reply's payload, or EncoderFailedError. samples: in the stream's wire dtype
        (audio/encode_wire.py), contiguous."""
        connection = self._connection
        while not connection.writable.is_set():  # backpressure: the process is behind
            await connection.writable.wait()
        if not self.alive:
            raise EncoderLostError(f"the encoder process (pid {self.pid}) of this response stopped")
        if opening is not None:
            self._queue(wire.CALL.pack(0, stream_id, wire.OPEN, len(opening)), opening)
        call_id = self._next_call
        self._next_call = call_id % 0xFFFFFFFF + 1  # never READY_CALL_ID
        future = asyncio.get_running_loop().create_future()
        if not self._calls:
            self._answered_at = time.monotonic()  # it owed nothing: its patience starts now
        self._calls[call_id] = _Call(future, audio_s)
        self._queue(wire.CALL.pack(call_id, stream_id, op, samples.nbytes), samples.data)
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def send_drop(self, stream_id: int) -> None:
        if self.alive:
            self._queue(wire.CALL.pack(0, stream_id, wire.DROP, 0))

    def _queue(self, *parts: bytes | memoryview) -> None:
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox += parts

    def _flush(self) -> None:
        parts, self._outbox = self._outbox, []
        if self.alive and self._connection.transport is not None:
            self._connection.transport.writelines(parts)

    def answered(self, call_id: int, status: int, payload: bytes) -> None:
        if call_id == wire.READY_CALL_ID:
            if status == wire.OK:
                self._ready.set_result(payload)
            else:
                self._ready.set_exception(EncoderFailedError(
                    f"an encoder process failed its start-up check: {payload.decode(errors='replace')}"))
            return
        self._answered_at = time.monotonic()
        call = self._calls.pop(call_id, None)
        if call is None or call.future.done():  # its caller was cancelled (the client left)
            return
        if status == wire.OK:
            call.future.set_result(payload)
        else:
            call.future.set_exception(EncoderFailedError(
                f"encoder process {self.pid}: {payload.decode(errors='replace')}"))

    # ------------------------------------------------------------------ answering or not
    def silent_s(self, now: float) -> float:
        """How long it has owed a reply without sending one (0 while it owes none)."""
        return now - self._answered_at if self._calls else 0.0

    def patience_s(self, timeout_s: float) -> float:
        """How long its current call may take: the pool's timeout plus the call's allowance."""
        first = next(iter(self._calls.values()), None)
        return timeout_s + (CALL_ALLOWANCE_S_PER_AUDIO_S * first.audio_s if first else 0.0)

    def wedged(self, silent_s: float) -> None:
        """It stopped answering (stopped, or stuck in a codec): SIGKILL it and fail what it
        owes, as a death does (the pool replaces it)."""
        logger.error("encoder process %d answered nothing for %.1f s with %d call(s) waiting: "
                     "killing it", self.pid, silent_s, len(self._calls))
        if self.popen.poll() is None:
            self.popen.kill()
        self.lost(f"the encoder process (pid {self.pid}) of this response stopped answering")
        if self._connection.transport is not None:
            self._connection.transport.abort()

    # ------------------------------------------------------------------ ending
    def lost(self, reason: str | None = None) -> None:
        """The socket closed (the process exited or is exiting) or the process was killed for
        not answering: fail what waits on it."""
        was_alive, self.alive = self.alive, False
        error = EncoderLostError(reason or f"the encoder process (pid {self.pid}) of this response stopped")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EncoderFailedError(
                f"an encoder process (pid {self.pid}) exited during its start-up check"))
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if not call.future.done():
                call.future.set_exception(error)
        if was_alive:
            self._on_lost(self, len(calls))

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
