"""How many streams run at once: a limit steered by the leads the listeners actually have
(docs/architecture.md#admission-a-measured-limit).

The limit plays the part of a congestion window (TCP; Netflix's concurrency-limits, Envoy's
adaptive-concurrency filter), with each listener's lead as the signal where those use latency:

- The signal: every steady chunk of a stream reports the lead its listener had just before it
  arrived (engine/deadlines/playback_clock.py `sent`) and whether it is losing ground (the lead
  shrank since the previous chunk); a stream's first chunk reports the time left in its
  first-audio budget since its admission (an admitted stream whose first audio comes late was as
  much too many as one that stalls); the ramp's chunks only when a listener already waited
  (engine/output_processor.py `lead_report`). `tail_us` is the low tail of the leads of the last WINDOW_US: their TAIL_PPM
  quantile (the lowest one while fewer than 1 / TAIL_PPM came). A chunk a player waited for
  shows as a negative lead at once, before the listener's wait reaches the 100 ms that counts as
  a stall.
- Start: the capacity measured at start-up (the step times and Stage 1 costs the engine timed,
  `SlackPolicy.predicted_capacity`), or every slot when nothing was timed.
- Falling: when the tail is below the margin (`lead_margin_ms`) and some listener below the margin
  is still losing ground (its lead smaller than before its previous chunk), while no more
  streams run than the limit allows, the limit drops to BACKOFF of the
  streams running over the window (at least one fewer), or to the measured capacity when that is lower (the
  step model has now seen live steps at this load: the leads say it is too many, the step times
  by how much), and that count is remembered as the ceiling: the
  streams the engine holds now already hurt someone. It is not judged again until a whole window
  of leads has come in at the new load. Listeners below the margin that are all catching up, or
  streams still running over a limit that just fell (they leave only as they end: a stream is
  seconds long), hold the limit where it is: the load now is not what put them behind, or the
  last fall has not taken effect yet, and falling again would only count the same distress twice.
- Healthy and binding (the tail at or above the margin, or no leads yet; as many streams run as
  the limit allows while others wait, or were refused within the last window: a refused stream
  is demand too, and a limit that counted only the queue would never learn past the count it
  refuses at): the limit probes upward by √limit (at least one) every
  PROBE_US, as Gradient2's headroom does, and jumps to the measured capacity when that is higher
  (a burst never waits for the probe to climb where the start-up timings already say it fits).
  Under a remembered ceiling the jump stops one short of it, and only the probe passes it, one
  stream a window at a time, so a capacity that was wrong does not make the same burst twice
  (on a loaded 2-core host the limit jumped back to a capacity the cores did not have every few
  seconds). The ceiling is forgotten after CEILING_US: what hurt then may fit now (another tenant left the GPU, shorter prompts). One
  stream alone losing ground never makes it fall: there is no load to shed (a cold path at
  start-up, a host hiccup), and a limit of one would refuse the next burst.
- A limit that is not binding does not move upward: a quiet server does not learn a limit it
  never tried (the window the others call "in flight < limit / 2").

Leads arrive from any thread (`observe`: one deque append); everything else runs on the engine
thread. Times are integer microseconds on the engine's clock.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

WINDOW_US = 1_000_000  # the leads a decision reads: the last second's
TAIL_PPM = 10_000  # their 1st percentile
PROBE_US = 250_000  # the leads are judged this often; one upward step each, while the limit binds
BACKOFF = 0.9  # share of the running streams kept when the leads fall
CEILING_US = 30_000_000  # how long the count that hurt caps the jump to the measured capacity
PEAK_US = 30_000_000  # how long the most streams held at once is remembered (`recent_peak`)
TICK_US = 20_000  # the tail is read again at most this often (a sort of the window's leads)


@dataclass(frozen=True)
class LimitState:
    """A snapshot for metrics and logs."""

    limit: int
    tail_us: int | None  # the low tail of the last window's leads (None: no lead in it)
    ceiling: int | None  # the running count at the last fall, while remembered


class StreamLimit:
    def __init__(self, max_streams: int, margin_us: int, initial: int | None = None):
        """`max_streams`: the slots (the limit never passes them); `margin_us`: the floor the low
        tail of the leads must stay on; `initial`: the capacity measured at start-up (None: every
        slot)."""
        self.max_streams = max_streams
        self.margin_us = margin_us
        self._limit = float(min(max_streams, initial or max_streams))
        # (at_us, lead_us, losing ground) from any thread; the engine thread's last WINDOW_US
        self._inbox: deque[tuple[int, int, bool]] = deque()
        self._window: deque[tuple[int, int, bool]] = deque()
        self._ceiling: int | None = None
        self._ceiling_until_us = 0
        self._judge_after_us = 0  # the next reading of the leads (PROBE_US on; a window after a fall)
        self._refused_us = -WINDOW_US - 1  # the last stream turned away at arrival
        self._running_peak = 0  # the most streams running at once over about the last window, since
        self._running_peak_us = 0
        self._peak = 0  # the most streams held at once lately, and when
        self._peak_us = 0
        self.changes = {"fall": 0, "probe": 0, "jump": 0}  # how often the limit moved, and how
        self._tail_us: int | None = None  # the last reading, and when it was taken
        self._read_us: int | None = None

    @property
    def limit(self) -> int:
        return max(1, int(self._limit))

    def seed(self, capacity: int) -> None:
        """Start from a capacity measured at start-up (before any lead came)."""
        self._limit = float(max(1, min(self.max_streams, capacity)))

    def observe(self, at_us: int, lead_us: int, losing: bool) -> None:
        """A stream's chunk left with its listener `lead_us` ahead, `losing` ground (module note;
        any thread)."""
        self._inbox.append((at_us, lead_us, losing))

    def refused(self, now_us: int) -> None:
        """A stream was turned away at arrival (the engine thread): demand the limit did not let in."""
        self._refused_us = now_us

    def update(self, now_us: int, running: int, waiting: int, capacity: Callable[[], int]) -> int:
        """The limit now: judge the last window's leads, then back off or probe (module note).
        `running` / `waiting`: streams; `capacity()`: the measured capacity (asked only when the
        limit moves)."""
        self._note_load(now_us, running + waiting)
        self._running_peak = max(self._running_peak, running)
        if now_us < self._judge_after_us:
            return self.limit
        tail = self._tail(now_us)
        if self._ceiling is not None and now_us >= self._ceiling_until_us:
            self._ceiling = None
        self._judge_after_us = now_us + PROBE_US
        if now_us - self._running_peak_us >= WINDOW_US:  # the peak spans about one window
            self._running_peak, self._running_peak_us = running, now_us
        if tail is not None and tail < self.margin_us:
            held = max(running, self._running_peak)
            # one stream alone is no load to shed (a cold path, a host hiccup: not the limit's doing)
            if held > 1 and running <= self.limit and self._losing_ground():
                self._fall(now_us, held, capacity())
        elif running >= self.limit and (waiting or now_us - self._refused_us <= WINDOW_US):
            self._probe(now_us, capacity())
        return self.limit

    def recent_peak(self, now_us: int) -> int:
        """The most streams (running and waiting) the engine held at once lately (PEAK_US): the
        load a new stream's first chunk is planned for (slack_policy.py `stream_window`)."""
        return self._peak if now_us - self._peak_us <= PEAK_US else 0

    def state(self, now_us: int) -> LimitState:
        return LimitState(self.limit, self._tail(now_us), self._ceiling)

    def _note_load(self, now_us: int, streams: int) -> None:
        if streams >= self._peak or now_us - self._peak_us > PEAK_US:
            self._peak, self._peak_us = streams, now_us

    def _fall(self, now_us: int, running: int, capacity: int) -> None:
        """`running`: the most streams that ran over the window whose leads fell."""
        held = max(running, 1)
        self._limit = float(max(1, min(held - 1, math.floor(held * BACKOFF), capacity)))
        self.changes["fall"] += 1
        logger.info("stream limit %d -> %d: a listener lost ground (lead tail %.0f ms over the last second, "
                    "%d streams ran, measured capacity %d)", held, self.limit, (self._tail_us or 0) / 1000, held,
                    capacity)
        self._ceiling = held
        self._ceiling_until_us = now_us + CEILING_US
        # judge again only on leads of the load after the fall
        self._judge_after_us = now_us + WINDOW_US
        self._window.clear()
        self._tail_us = None

    def _probe(self, now_us: int, capacity: int) -> None:
        limit = self._limit
        ceiling = self._ceiling
        if ceiling is not None and limit + 1 >= ceiling:  # at or past what hurt: one more, a window on
            target = limit + 1.0
            self._judge_after_us = now_us + WINDOW_US
        else:
            target = limit + max(1.0, math.sqrt(limit))
            if ceiling is not None:
                target = min(target, ceiling - 1.0)
        jump = capacity if ceiling is None else min(capacity, ceiling - 1)
        kind = "jump" if jump > target else "probe"
        before = self.limit
        self._limit = float(min(self.max_streams, max(target, jump)))
        if self.limit > before:
            self.changes[kind] += 1
            logger.info("stream limit %d -> %d: streams wait or were refused and the leads hold (%s; measured "
                        "capacity %d)", before, self.limit, kind, capacity)

    def _tail(self, now_us: int) -> int | None:
        """The low tail of the last window's leads, read at most every TICK_US."""
        if self._read_us is not None and 0 <= now_us - self._read_us < TICK_US:
            return self._tail_us
        self._read_us = now_us
        self._tail_us = self._read(now_us)
        return self._tail_us

    def _read(self, now_us: int) -> int | None:
        window = self._window
        inbox = self._inbox
        while inbox:
            window.append(inbox.popleft())
        horizon = now_us - WINDOW_US
        while window and window[0][0] < horizon:
            window.popleft()
        if not window:
            return None
        leads = sorted(lead for _, lead, _ in window)
        return leads[len(leads) * TAIL_PPM // 1_000_000]

    def _losing_ground(self) -> bool:
        """Some listener under the margin in the window is still falling behind."""
        margin = self.margin_us
        return any(losing and lead < margin for _, lead, losing in self._window)
