"""Real-time capacity, measured (docs/architecture.md#admission-a-measured-limit).

A stream played at speed s needs one Stage 0 row every frame_us / s (40 ms at 1x: 25 frames a
second) and its share of each Stage 1 thread. With `headroom` h of real time kept spare, n streams
fit while

    step_us(n) ≤ (1 − h) · frame_us / s_max     Stage 0: the step model's time of a step of n decodes
    n · s_max · cost(n) ≤ 1 − h                  Stage 1: the busiest thread's busy time per audio
                                                 second while n streams feed it

(one stream always fits). With the step times and Stage 1 costs the engine timed at start-up
this is the measured capacity the stream limit starts from and jumps to (stream_limit.py); it
never decides alone while places under the limit are free and the leads hold.

A stream that finds every place under the stream limit taken waits for running streams to end.
`predicted_wait_us` plays that forward: the limit's free places open now, each running stream's place when it ends, and each
stream queued ahead takes the first place to open and holds it for its expected length. What the
new request waits is when the next place opens after them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PPM = 1_000_000


@dataclass(frozen=True)
class AdmissionRule:
    frame_us: int  # one frame's playback at 1x (40,000 µs at 25 frames a second)
    headroom_ppm: int  # share of real time kept spare, in millionths

    def step_target_us(self, max_speed: float = 1.0) -> int:
        """The longest step that keeps every stream at least (1 − h) ahead of real time."""
        return int(self.frame_us * (PPM - self.headroom_ppm) / PPM / max_speed)

    def fits(self, num_streams: int, step_us: int, stage1_cost_ppm: int, max_speed: float = 1.0) -> bool:
        """Whether `num_streams` streams keep up when a step of them takes `step_us` and each
        second of their audio costs the busiest Stage 1 thread `stage1_cost_ppm` of a second."""
        if num_streams <= 1:
            return True
        stage1_ok = num_streams * stage1_cost_ppm * max_speed <= PPM - self.headroom_ppm
        return stage1_ok and step_us <= self.step_target_us(max_speed)

    def capacity(self, step_us_of: Callable[[int], int], stage1_ppm_of: Callable[[int], int], limit: int,
                 max_speed: float = 1.0) -> int:
        """The most streams (at most `limit`) that fit; `step_us_of(n)` predicts a step of n,
        `stage1_ppm_of(n)` Stage 1's cost per audio second with n streams (a bisection: more
        streams never make a step shorter or Stage 1's total cost lower)."""
        lo, hi = 1, max(1, limit)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fits(mid, step_us_of(mid), stage1_ppm_of(mid), max_speed):
                lo = mid
            else:
                hi = mid - 1
        return lo


def predicted_wait_us(ends_us: Sequence[int], ahead_us: Sequence[int], free: int) -> int:
    """How long a stream arriving now waits for a place (module note).

    ends_us: when each running stream ends, from now; ahead_us: the expected length of each
    stream queued ahead, in order; free: places open now (capacity − running, may be < 0: a
    running stream over the capacity ends before its place opens for the queue)."""
    opens = sorted(ends_us)
    over = max(0, -free)
    opens = opens[over:] + [0] * max(0, free)  # the earliest ends free places held over capacity
    if not opens:
        return 0
    heapq.heapify(opens)
    for length in ahead_us:
        heapq.heappush(opens, heapq.heappop(opens) + length)
    return opens[0]
