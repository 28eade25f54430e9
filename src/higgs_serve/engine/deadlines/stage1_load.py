"""Stage 1's load as the deadline policy reads it (docs/architecture.md#deadlines).

- latency: how long a window takes from its hand-off to the codec until its audio reaches the
  caller's sink (the codec's queue and call, then the mark stage's), a moving average: the part
  of a stream's slack that Stage 0 cannot buy back. Its jitter (twice the moving average of how
  far a window's latency is from that average) is what the first chunk must cover beside the
  cost per frame (codec/chunker.py `ramp_initial_frames`).
- cost: the busy seconds each Stage 1 thread (the codec's, the mark stage's) spends per second of
  audio it handles (the busiest one's for admission, their sum per frame for the first chunk), refreshed at most once every REFRESH_S from the threads' running totals. A
  stream at 1x needs `cost` of a thread's time, so n streams fit a thread while n · cost stays
  below one (admission.py).
- cost by window batch (`seed`): what the engine timed at start-up (startup_timings.py), per
  thread, a call of b steady-state windows. A thread's cost per audio second falls as its calls
  grow, and n streams keep it busy with calls of up to min(n, cap) windows, so the capacity reads
  `cost_ppm_at(n)`: the timed cost at the largest timed batch not above n (never an
  extrapolation). Unseeded, it is the running cost above, which at low load (windows one by one)
  is the highest it will be.
Written by the thread that delivers chunks, read by the engine thread: floats, no lock.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence

REFRESH_S = 1.0
MIN_AUDIO_S = 0.2  # an interval with less audio than this says nothing about the cost
ALPHA = 0.2

# A Stage 1 thread's running totals: () -> (busy seconds, seconds of audio handled).
ThreadTotals = Callable[[], tuple[float, float]]


class Stage1Load:
    def __init__(self, threads: Sequence[ThreadTotals], clock: Callable[[], float] = time.perf_counter):
        self._threads = list(threads)
        self._clock = clock
        self._last = [totals() for totals in self._threads]
        self._last_s = clock()
        self._cost = [0.0] * len(self._threads)  # busy s per audio s, per thread
        self._latency_us = 0.0
        self._deviation_us = 0.0
        self._timed: list[tuple[list[int], list[int]]] = []  # per thread: (batches ascending, ppm)

    @property
    def latency_us(self) -> int:
        return int(self._latency_us)

    @property
    def jitter_us(self) -> int:
        return int(2 * self._deviation_us)

    def window_done(self, latency_us: int) -> None:
        """A window's audio reached the caller's sink `latency_us` after its hand-off."""
        if latency_us >= 0:
            self._deviation_us += ALPHA * (abs(latency_us - self._latency_us) - self._deviation_us)
            self._latency_us += ALPHA * (latency_us - self._latency_us)

    def us_per_frame(self, frame_us: int) -> int:
        """Stage 1's time for one more frame in a window, all its threads (a window passes each)."""
        self.cost_ppm()  # refreshed
        return int(sum(self._cost) * frame_us)

    def seed(self, curves: Sequence[Mapping[int, int]]) -> None:
        """Each thread's cost per audio second by window batch, timed at start-up (millionths)."""
        self._timed = [(sorted(curve), [curve[b] for b in sorted(curve)]) for curve in curves if curve]

    def cost_ppm_at(self, num_streams: int) -> int:
        """The busiest thread's cost per audio second while `num_streams` streams feed it (module
        note; the running cost when nothing was timed)."""
        if not self._timed:
            return self.cost_ppm()
        costs = []
        for batches, ppm in self._timed:
            i = max(0, bisect.bisect_right(batches, num_streams) - 1)
            costs.append(ppm[i])
        return max(costs)

    def cost_ppm(self) -> int:
        """The busiest thread's busy time per second of audio, in millionths (refreshed here)."""
        now = self._clock()
        if now - self._last_s >= REFRESH_S:
            self._refresh(now)
        return int(max(self._cost, default=0.0) * 1_000_000)

    def _refresh(self, now: float) -> None:
        for i, totals in enumerate(self._threads):
            busy, audio = totals()
            last_busy, last_audio = self._last[i]
            if audio - last_audio >= MIN_AUDIO_S:
                cost = (busy - last_busy) / (audio - last_audio)
                self._cost[i] = cost if self._cost[i] == 0.0 else self._cost[i] + ALPHA * (cost - self._cost[i])
                self._last[i] = (busy, audio)
        self._last_s = now
