"""A streamed response's audio as its listener meets it, seen from the server
(docs/operations.md#stalls), and the engine's feed of when that audio left.

One `PlaybackMeter` per streamed response; its `AudioOut` calls `sent(samples)` each time a
chunk's bytes are ready to leave. The meter
- tells the engine (`audio_sent`): the engine's playback clock of the request turns it into the
  deadlines its scheduler, codec and mark stage serve first (engine/deadlines/);
- keeps the listener's own clock (engine/deadlines/playback_clock.py, the same arithmetic): the
  lead each chunk leaves with (the audio sent before it, played at the response's speed, less the
  time since the first audio) goes into the slack histogram, and the stream counts as stalled the
  first time its lead falls below −STALL_S: a player that started at the first byte is then more
  than 100 ms behind (the rule of bench_serving and the peers' continuity checks).
A long-form response has one meter over all its segments; `report_to` names the segment's
engine request each time one starts, and `deadline_s` tells the next segment when its first audio
is due.
"""

from __future__ import annotations

from collections.abc import Callable

from higgs_serve.engine.deadlines.playback_clock import STALL_US, US_PER_S, PlaybackClock, now_us
from higgs_serve.metrics import ServerMetrics

STALL_S = STALL_US / US_PER_S

# (request id, samples at the model's rate, time.perf_counter()) -> None: the engine's audio_sent
AudioSent = Callable[[str, int, float], None]


class PlaybackMeter:
    def __init__(self, audio_sent: AudioSent, request_id: str, metrics: ServerMetrics, speed: float,
                 sample_rate_hz: int):
        self._audio_sent = audio_sent
        self._request_id = request_id
        self._metrics = metrics
        self._clock = PlaybackClock(speed, now_us(), sample_rate_hz=sample_rate_hz)
        self.stalled = False
        self._closed = False

    def report_to(self, request_id: str) -> None:
        """Tell the engine about request `request_id` from now on (a long-form segment)."""
        self._request_id = request_id

    def sent(self, samples: int) -> None:
        """`samples` (at the model's rate) are leaving now."""
        if samples <= 0:
            return
        at = now_us()
        self._audio_sent(self._request_id, samples, at / US_PER_S)
        started = self._clock.started
        lead_s = self._clock.sent(samples, at) / US_PER_S
        if not started:
            return
        self._metrics.stream_slack_seconds.observe(lead_s)
        if lead_s < -STALL_S and not self.stalled:
            self.stalled = True
            self._metrics.streams_stalled.inc()

    def deadline_s(self) -> float:
        """When the listener runs out of the audio sent so far (time.perf_counter())."""
        return self._clock.deadline_us() / US_PER_S

    def close(self) -> None:
        """The response ended: count it as a stream when it sent audio (once)."""
        if not self._closed and self._clock.started:
            self._metrics.streams.inc()
        self._closed = True
