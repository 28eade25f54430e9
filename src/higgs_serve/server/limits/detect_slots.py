"""Watermark detections in flight: at most `running` at once on threads of their own. One that
finds them all busy waits its turn (first come, first served) for up to `wait_s`
(--detect-wait-s); it is refused with a 429 and `Retry-After` only when the wait would pass that
bound: at once when the wait it faces is already longer, else when it has waited that long
(docs/api.md#limits).

The wait a newcomer faces: the detections ahead of it (those waiting, then itself), `running` at
a time, each taking the mean time of the recent ones (`mean_s`, weighted toward the latest);
before any detection has finished nothing is known and a newcomer simply waits. Retry-After is
that wait, rounded up.

Memory: one detection holds a few tens of MB while it runs (audio/watermark_detect.py decodes,
resamples and scores a file block by block) and CPU seconds per minute of audio; a waiting one
holds only its upload, which the form parser had already read (in memory up to 1 MB, spooled to
disk past it) before the detection asked for a slot, waiting or not. So the running bound is
what bounds the memory, as before; the wait bound keeps the waiting few: a queue that clears
within `wait_s` at `running` at a time holds small uploads only (a 1 MB one takes about a
second to judge), and the early refusal turns long ones away before they wait. Both bounds keep
detections from taking the audio threads that reference clips need
(server/last_mile/audio_workers.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from higgs_serve.errors import EngineOverloadedError
from higgs_serve.server.settings import DEFAULT_DETECT_WAIT_S

T = TypeVar("T")
DETECT_RUNNING = 2
MEAN_WEIGHT = 0.2  # of the latest detection's time in `mean_s`


class DetectorBusyError(EngineOverloadedError):
    """The wait for a detection slot would pass the bound: 429 with Retry-After."""


class DetectSlots:
    """The event loop is its only caller (the counts need no lock)."""

    def __init__(self, running: int = DETECT_RUNNING, wait_s: float = DEFAULT_DETECT_WAIT_S):
        if running < 1 or wait_s < 0:
            raise ValueError(f"detect slots need running >= 1 and wait_s >= 0, got {running}, {wait_s}")
        self.running, self.wait_s = running, wait_s
        self._free = running
        self._queue: deque[asyncio.Future] = deque()  # the waiting, in arrival order
        self.mean_s: float | None = None  # recent detections' time, seconds (None: none finished)
        self._executor = ThreadPoolExecutor(running, thread_name_prefix="higgs-detect")

    @property
    def in_flight(self) -> int:
        """Detections running or waiting."""
        return self.running - self._free + len(self._queue)

    def expected_wait_s(self) -> float | None:
        """How long a detection arriving now would wait for its slot (None: unknown yet)."""
        if self._free > 0 and not self._queue:
            return 0.0
        if self.mean_s is None:
            return None
        return math.ceil((len(self._queue) + 1) / self.running) * self.mean_s

    async def run(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on a detection thread once a slot is free, or DetectorBusyError (module note)."""
        await self._acquire()
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))
        finally:
            took_s = time.perf_counter() - started
            self.mean_s = took_s if self.mean_s is None else (1 - MEAN_WEIGHT) * self.mean_s + MEAN_WEIGHT * took_s
            self._release()

    async def _acquire(self) -> None:
        if self._free > 0 and not self._queue:
            self._free -= 1
            return
        expected_s = self.expected_wait_s()
        if expected_s is not None and expected_s > self.wait_s:
            raise self._busy(expected_s)
        place = asyncio.get_running_loop().create_future()
        self._queue.append(place)
        try:
            await asyncio.wait_for(place, self.wait_s)  # set by _release: its slot is handed over
        except TimeoutError:
            raise self._busy(self.expected_wait_s()) from None
        except BaseException:  # cancelled (the client left) just as its slot came: pass it on
            if place.done() and not place.cancelled():
                self._release()
            raise
        finally:
            if place in self._queue:
                self._queue.remove(place)

    def _release(self) -> None:
        """A slot is free: the first one still waiting takes it, else it is free."""
        while self._queue:
            place = self._queue.popleft()
            if not place.done():
                place.set_result(None)
                return
        self._free += 1

    def _busy(self, expected_s: float | None) -> DetectorBusyError:
        retry_after_s = max(1, math.ceil(expected_s or 0.0))
        return DetectorBusyError(
            f"{self.running} watermark detections are running and {len(self._queue)} waiting; a new one "
            f"would wait more than {self.wait_s:g} s; retry in {retry_after_s} s", retry_after_s)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
