"""What a listener hears: a real-time player fed by a stream's arrivals, and the level's
continuity and goodput from it (bench_serving.py). Pure functions of (time, bytes) arrivals, so
the tests pin them with synthetic streams.

The player starts at the first audio bytes and plays at 1x. When it has played everything
received before the stream ended it stalls until the next bytes arrive, then plays on at once.
A stream is *stalled* when its player falls more than the threshold (100 ms by default) behind
the 1x schedule that started at its first byte: the sum of its stalls, which is also the worst
deficit `(t_i - t_0) - audio received before read i` over its reads (the rule vllm-omni's and
sglang-omni's continuity checks use). Beside it, the stricter-to-read "one gap" count: streams
with a single stall over the threshold (two 60 ms stalls stall a stream by the first rule, not
by this one).

Goodput: the streams a listener could use, those whose TTFA is within a budget (1 s by default;
counted from the request's first try when it was refused and retried) and that are not stalled;
their count, their share of the streamed requests the level sent, and their audio per wall second.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import percentile  # noqa: E402

Arrivals = Sequence[tuple[float, int]]  # (time s, bytes) per read, in arrival order


def playback_stalls(arrivals: Arrivals, bytes_per_s: float) -> list[tuple[float, float]]:
    """(where, how long) of each stall of a real-time player fed by `arrivals`: the seconds of
    audio it had played when it ran dry, and the seconds it waited.

    Playback starts when the first bytes arrive; the player runs dry at `play_end`; bytes that
    arrive later than that mean it stalled for the gap, then playback resumes at once.
    """
    stalls = []
    play_end = None
    received = 0.0  # seconds of audio before this read
    for t, n in arrivals:
        if n <= 0:
            continue
        duration = n / bytes_per_s
        if play_end is None:
            play_end = t + duration
        elif t > play_end:
            stalls.append((received, t - play_end))
            play_end = t + duration
        else:
            play_end += duration
        received += duration
    return stalls


def gapless_start(arrivals: Arrivals, bytes_per_s: float) -> float | None:
    """The earliest start time from which a 1x player never stalls: every read must arrive
    before the audio received ahead of it has played, so start >= t_i - (bytes before i) / rate
    for every read i (the first read gives start >= its own time)."""
    start, received = None, 0
    for t, n in arrivals:
        if n <= 0:
            continue
        start = max(start if start is not None else t, t - received / bytes_per_s)
        received += n
    return start


def behind_s(arrivals: Arrivals, bytes_per_s: float) -> float:
    """How far behind its 1x schedule a player that started at the first byte ended up: the
    gapless start less the first byte (0.0 for a stream that never ran dry, or no audio)."""
    first = next((t for t, n in arrivals if n > 0), None)
    start = gapless_start(arrivals, bytes_per_s)
    return 0.0 if first is None else start - first


class Heard(NamedTuple):
    """One completed stream as its listener met it."""
    ttfa_s: float  # from the request's first try to its first audio bytes
    behind_s: float  # total stall of its player (behind_s above)
    longest_stall_s: float  # its longest single stall
    audio_s: float


def heard(ttfa_s: float, arrivals: Arrivals, bytes_per_s: float, audio_s: float) -> Heard:
    stalls = playback_stalls(arrivals, bytes_per_s)
    return Heard(ttfa_s, behind_s(arrivals, bytes_per_s), max((s for _, s in stalls), default=0.0), audio_s)


def is_good(stream: Heard, ttfa_budget_s: float, stall_threshold_s: float) -> bool:
    """Goodput's rule: first audio within the budget and never more than the threshold behind."""
    return stream.ttfa_s <= ttfa_budget_s and stream.behind_s <= stall_threshold_s


def continuity_metrics(streams: Sequence[Heard], streamed_requests: int, window_s: float,
                       ttfa_budget_s: float, stall_threshold_s: float) -> dict:
    """A level's stalled share (of its completed streams) and goodput (of the streamed requests
    it sent, refused and failed ones included)."""
    stalled = [s for s in streams if s.behind_s > stall_threshold_s]
    one_gap = [s for s in streams if s.longest_stall_s > stall_threshold_s]
    good = [s for s in streams if is_good(s, ttfa_budget_s, stall_threshold_s)]
    behind_ms = [1e3 * s.behind_s for s in streams]
    good_audio = sum(s.audio_s for s in good)
    return {
        "stalled_streams": len(stalled),
        "stalled_share": len(stalled) / len(streams) if streams else None,
        "stalled_one_gap_streams": len(one_gap),
        "stalled_one_gap_share": len(one_gap) / len(streams) if streams else None,
        "stream_behind_ms_p50": percentile(behind_ms, 50), "stream_behind_ms_p95": percentile(behind_ms, 95),
        "stream_behind_ms_max": max(behind_ms, default=None),
        "goodput_streams": len(good),
        "goodput_share": len(good) / streamed_requests if streamed_requests else None,
        "goodput_audio_s": good_audio,
        "goodput_audio_s_per_s": good_audio / window_s if window_s > 0 else None,
    }
