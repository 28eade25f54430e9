"""Dedicated, bounded thread pools for the server's CPU-heavy audio work.

Decoding and resampling reference clips, running the reference encoder, time-stretching and
encoding responses all leave the event loop for threads. They get their own pool of
AUDIO_WORKERS threads rather than asyncio's default executor, so a burst of expensive clips queues
behind itself instead of occupying the threads every other part of the server (and libraries
using `asyncio.to_thread`) rely on, and at most AUDIO_WORKERS clips are decoded at once. Response
encoding has a pool of its own (ServerState.encode_workers, --encode-threads threads), so clips
never wait behind encoders and encoders never behind clips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

T = TypeVar("T")


class AudioWorkers:
    def __init__(self, max_workers: int, name: str = "higgs-audio"):
        self.max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on one of the pool's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
