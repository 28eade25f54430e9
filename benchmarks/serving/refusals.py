"""Refused requests and the closed-loop client's retries (bench_serving.py).

A server that has no room for a stream answers 503 (or 429, its queue full) at once, with a
`Retry-After` header, rather than a stream that stutters. bench_serving's client then does what a
well-behaved client does: it waits `Retry-After` seconds (or a small doubling backoff where the
header is missing) and sends the same request again, until it is admitted (or `--max-tries`, or
its request timeout counted from the first try, runs out: it gave up). Its TTFA counts from the
first try, so the wait is part of what its listener waited.

Per level: how many requests were refused at least once and their share, the refused answers,
how soon each came (time to refusal, from sending that try), whether it carried `Retry-After`
and what it said, the tries per request, and the requests that gave up.
"""

from __future__ import annotations

import email.utils
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import mean, percentile  # noqa: E402

RETRYABLE_STATUS = frozenset({429, 503})
MAX_BACKOFF_S = 2.0  # the doubling backoff's ceiling where a refusal names no Retry-After


@dataclass(frozen=True)
class Refusal:
    status: int
    after_s: float  # from sending that try to the refusal's status line
    retry_after_s: float | None  # what its Retry-After said (None: no header, or unreadable)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for: delay-seconds, or an HTTP date (seconds from
    `now`, wall clock, never negative); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds)


def retry_wait_s(refusal: Refusal, tries: int, backoff_s: float) -> float:
    """How long the client waits before its next try: the server's Retry-After where it gave
    one, else `backoff_s` doubled per refused try so far (capped at MAX_BACKOFF_S)."""
    if refusal.retry_after_s is not None:
        return refusal.retry_after_s
    return min(MAX_BACKOFF_S, backoff_s * 2 ** max(0, tries - 1))


def refusal_metrics(refusals: Sequence[Sequence[Refusal]], final_status: Sequence[int]) -> dict:
    """refusals[i]: the refused answers of request i, in order; final_status[i]: the status of
    its last try (200: admitted; a refusal's: it gave up; 0: no answer)."""
    every = [r for per_request in refusals for r in per_request]
    refused = [bool(per_request) for per_request in refusals]
    after_ms = [1e3 * r.after_s for r in every]
    named = [r.retry_after_s for r in every if r.retry_after_s is not None]
    tries = [1 + len(per_request) for per_request in refusals]
    statuses: Mapping[int, int] = Counter(r.status for r in every)
    return {
        "refused_requests": sum(refused),
        "refused_share": sum(refused) / len(refusals) if refusals else None,
        "refusals": len(every),
        "refusal_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "refusals_with_retry_after": len(named),
        "retry_after_share": len(named) / len(every) if every else None,
        "retry_after_s_max": max(named, default=None),
        "refusal_ms_p50": percentile(after_ms, 50), "refusal_ms_p95": percentile(after_ms, 95),
        "tries_per_request_mean": mean(tries), "tries_max": max(tries, default=None),
        "admitted_after_retry": sum(1 for r, status in zip(refused, final_status) if r and status == 200),
        "gave_up": sum(1 for r, status in zip(refused, final_status) if r and status in RETRYABLE_STATUS),
    }
