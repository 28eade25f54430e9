"""Issue 53: a stream's playback clock (engine/deadlines/playback_clock.py): its deadline before
and after its first audio, the speed, the server's reports over the engine's own feed, the lead
each send leaves with."""

import pytest

from higgs_serve.engine.deadlines.playback_clock import Playback, PlaybackClock, clock_for
from higgs_serve.errors import InvalidRequestError

MS = 1000
T0 = 5_000_000


def test_before_its_first_audio_the_deadline_is_when_that_is_due():
    clock = PlaybackClock(1.0, T0, T0 + 500 * MS)
    assert clock.deadline_us() == T0 + 500 * MS and not clock.started


def test_after_it_the_first_audio_plus_the_audio_sent_at_the_speed():
    clock = PlaybackClock(1.0, T0, T0 + 500 * MS)
    assert clock.sent(960, T0 + 100 * MS) == 0  # one frame (40 ms) leaves first
    assert clock.deadline_us() == T0 + 140 * MS
    assert clock.sent(24000, T0 + 130 * MS) == 10 * MS  # a second more, 10 ms before it ran out
    assert clock.deadline_us() == T0 + 1140 * MS
    assert clock.sent(960, T0 + 1200 * MS) == -60 * MS  # its listener waited 60 ms
    fast = PlaybackClock(2.0, T0)
    fast.sent(24000, T0)
    assert fast.deadline_us() == T0 + 500 * MS  # at 2x a second of audio plays in half a second


def test_the_servers_reports_replace_the_engines_own_feed():
    clock = PlaybackClock(1.0, T0, T0 + 500 * MS)
    clock.delivered(0, T0)  # an empty chunk is no audio
    assert not clock.started
    clock.delivered(24000, T0 + 50 * MS)  # without reports: delivery to the caller's sink
    assert clock.deadline_us() == T0 + 1050 * MS
    clock.sent(24000, T0 + 80 * MS)  # the server says when it really left
    assert clock.deadline_us() == T0 + 1080 * MS


def test_queue_wait_and_the_callers_playback():
    clock = PlaybackClock(1.0, T0)
    assert clock.queue_wait_us is None
    clock.admitted_us = T0 + 250 * MS
    assert clock.queue_wait_us == 250 * MS
    assert clock_for(None, 24000) is None
    made = clock_for(Playback(speed=1.25, ttfa_budget_s=0.75, first_audio_due_s=12.5), 24000)
    assert (made.speed, made.ttfa_budget_us, made.first_audio_due_us) == (1.25, 750 * MS, 12_500 * MS)
    with pytest.raises(InvalidRequestError, match="speed"):
        Playback(speed=0.0)
    with pytest.raises(InvalidRequestError, match="ttfa_budget_s"):
        Playback(ttfa_budget_s=-1.0)
