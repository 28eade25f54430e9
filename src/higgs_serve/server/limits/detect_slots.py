"""Watermark detections in flight: at most `running` at once on threads of their own, at most
`waiting` more queued behind them, and a 429 past that (docs/api.md#limits).

One detection holds a few tens of MB while it runs (audio/watermark_detect.py decodes, resamples
and scores a file block by block) and CPU seconds per minute of audio; a waiting one holds only
its upload, which the form parser spooled to disk past 1 MB. Bounding both keeps a burst of
detections from growing the server by more than `running` detections' memory, and from taking
the audio threads that reference clips need (server/last_mile/audio_workers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from higgs_serve.errors import EngineOverloadedError

T = TypeVar("T")
DETECT_RUNNING = 2
DETECT_WAITING = 6


class DetectorBusyError(EngineOverloadedError):
    """Every detection slot and queue place is taken: 429 with Retry-After."""


class DetectSlots:
    """The event loop is its only caller (the count needs no lock)."""

    def __init__(self, running: int = DETECT_RUNNING, waiting: int = DETECT_WAITING):
        self.running, self.waiting = running, waiting
        self.in_flight = 0
        self._executor = ThreadPoolExecutor(running, thread_name_prefix="higgs-detect")

    async def run(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on a detection thread, or DetectorBusyError at once when full."""
        if self.in_flight >= self.running + self.waiting:
            raise DetectorBusyError(f"{self.running} watermark detections are running and {self.waiting} "
                                    "waiting; retry later")
        self.in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))
        finally:
            self.in_flight -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
