"""A streamed response's playback clock: when its listener runs out of audio
(docs/architecture.md#deadlines).

A request heard by a real-time player carries a `PlaybackClock` (request.py: `Request.playback`),
fed by the one place that knows when its audio left:

    deadline = first audio out + the audio out so far, played at `speed`   (24,000 samples a second at 1x)
    lead     = deadline − now        (the listener's buffer; below 0 a player that started at the
                                      first audio has fallen behind)
    slack    = lead − the work still needed before its next audio can leave   (slack_policy.py)

Before its first audio the deadline is `first_audio_due_us`: its arrival plus the policy's
first-audio target, or a later time the caller names (a long-form segment whose listener still
has the earlier segments' audio to play). The server reports each chunk as it leaves
(`EngineCore.audio_sent`); without such reports (in-process callers) a chunk counts as sent when
it reaches the caller's sink. Times are `time.perf_counter()` in integer microseconds.

Each field has one writer (the server's event loop: `sent`; the thread that hands chunks to the
caller's sink: `delivered`; the engine thread: `due_rows`, `admitted_us`) and the scheduler only
reads, so there is no lock: a stale read costs one step's accuracy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from higgs_serve.errors import InvalidRequestError

US_PER_S = 1_000_000
# a listener more than this behind has heard a stall (the rule of our benchmarks and the server's
# stall counter, server/last_mile/playback_meter.py)
STALL_US = 100_000


def now_us() -> int:
    """The engine's clock: `time.perf_counter()` in integer microseconds."""
    return time.perf_counter_ns() // 1000


def to_us(seconds: float) -> int:
    """A `time.perf_counter()` time (or a duration) in integer microseconds."""
    return int(round(seconds * US_PER_S))


@dataclass(frozen=True)
class Playback:
    """A caller's word that a request is heard by a real-time player (`SpeechRequest.playback`);
    a request without one has no deadline (files, batch items, `synth`)."""

    speed: float = 1.0  # seconds of audio the listener plays per second (the server's time stretch)
    # refuse the request at once (OverCapacityError, a 503 on the server) when its predicted
    # first audio is further away than this; None: it waits as long as it takes
    ttfa_budget_s: float | None = None
    # `time.perf_counter()` time its first audio is due; None: its arrival plus the policy's target
    first_audio_due_s: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.speed, (int, float)) and math.isfinite(self.speed) and self.speed > 0):
            raise InvalidRequestError(f"playback speed must be a positive number, got {self.speed!r}", "speed")
        if self.ttfa_budget_s is not None and not self.ttfa_budget_s > 0:
            raise InvalidRequestError(f"ttfa_budget_s must be positive, got {self.ttfa_budget_s!r}")


def clock_for(playback: Playback | None, sample_rate_hz: int) -> PlaybackClock | None:
    """A request's clock, started now (None: no player, no deadline)."""
    if playback is None:
        return None
    due = None if playback.first_audio_due_s is None else to_us(playback.first_audio_due_s)
    budget = None if playback.ttfa_budget_s is None else to_us(playback.ttfa_budget_s)
    return PlaybackClock(playback.speed, now_us(), due, budget, sample_rate_hz)


class _Tally:
    """Audio handed on so far: when the first of it went, how many samples, and so when a
    listener fed by it runs out (`end_us`); the lead before the last chunk and how it changed
    from the one before (None until there is one)."""

    __slots__ = ("first_us", "samples", "end_us", "lead_us", "change_us")

    def __init__(self) -> None:
        self.first_us: int | None = None
        self.samples = 0
        self.end_us: int | None = None
        self.lead_us: int | None = None
        self.change_us: int | None = None


class PlaybackClock:
    """One stream's clock (module note). All times in integer microseconds."""

    def __init__(self, speed: float, submitted_us: int, first_audio_due_us: int | None = None,
                 ttfa_budget_us: int | None = None, sample_rate_hz: int = 24000):
        self.speed = speed
        self.submitted_us = submitted_us
        # None until the policy sets its default (arrival + its first-audio target)
        self.first_audio_due_us = first_audio_due_us
        self.ttfa_budget_us = ttfa_budget_us  # refuse at arrival when the first audio would be later
        self.admitted_us: int | None = None  # when the scheduler gave it a slot
        # still waiting for its place at this time, its first audio can no longer come within
        # its budget (set at arrival when it may wait; the caller withdraws it then)
        self.admit_by_us: int | None = None
        # rows (sampled) at which its next codec window is due: output processing keeps it current
        self.due_rows = 0
        self._us_per_sample = US_PER_S / (sample_rate_hz * speed)
        self._sent = _Tally()  # the server's reports
        self._delivered = _Tally()  # chunks reaching the caller's sink

    @property
    def withdraw_at_us(self) -> int | None:
        """When a caller should withdraw it unstarted (None: admitted, or no budget)."""
        return self.admit_by_us if self.admitted_us is None else None

    @property
    def queue_wait_us(self) -> int | None:
        """Arrival to admission; None while it waits."""
        return None if self.admitted_us is None else self.admitted_us - self.submitted_us

    def played_us(self, samples: int) -> int:
        """How long `samples` (at the model's rate) play at this stream's speed."""
        return round(samples * self._us_per_sample)

    @property
    def started(self) -> bool:
        """Audio has gone out (sent, or delivered)."""
        return self._sent.first_us is not None or self._delivered.first_us is not None

    @property
    def has_sends(self) -> bool:
        """The caller reports sends (`sent`): the deadline follows those, not deliveries."""
        return self._sent.first_us is not None

    @property
    def has_deliveries(self) -> bool:
        return self._delivered.first_us is not None

    @property
    def lead_change_us(self) -> int | None:
        """How the lead before the last chunk compares with the one before it (sends when the
        caller reports them, else deliveries): below 0 the listener is losing ground."""
        tally = self._sent if self._sent.first_us is not None else self._delivered
        return tally.change_us

    def deadline_us(self) -> int:
        """When the listener runs out: the first audio's due time until audio has gone out.
        (Read once per stream per step at load: two attribute reads.)"""
        end = self._sent.end_us
        if end is None:
            end = self._delivered.end_us
        if end is None:
            return self.first_audio_due_us if self.first_audio_due_us is not None else self.submitted_us
        return end

    def sent(self, samples: int, at_us: int) -> int:
        """The server sent `samples` more at `at_us`; returns the lead the listener had just
        before (0 for the first audio)."""
        return self._add(self._sent, samples, at_us)

    def delivered(self, samples: int, at_us: int) -> int:
        """A chunk of `samples` reached the caller's sink (the clock's feed when nobody reports
        sends); returns the lead a listener fed by deliveries had just before (0 for the first)."""
        return self._add(self._delivered, samples, at_us)

    def _add(self, tally: _Tally, samples: int, at_us: int) -> int:
        if tally.first_us is None:
            if samples <= 0:  # an empty final chunk is no audio
                return 0
            tally.first_us = at_us
            lead = 0
        else:
            lead = tally.end_us - at_us
            if tally.lead_us is not None:
                tally.change_us = lead - tally.lead_us
            tally.lead_us = lead
        tally.samples += samples
        tally.end_us = tally.first_us + self.played_us(tally.samples)
        return lead
