"""Stage 0's step time, learned from the engine's own steps (docs/architecture.md#deadlines).

    predict_us(num_seqs, num_tokens) = D(num_seqs) + c · (num_tokens − num_seqs)

D(n), the time of a step that decodes n sequences, is a moving average per n of the measured
decode-only steps plus SPREAD times the moving average of how far they fall from it: a host
whose steps vary (other work on its cores or GPU) is planned for its slow steps, not its mean
ones, and a steady GPU loses nothing. Between two measured n it is interpolated linearly; above the largest measured
n it grows with the slope of the measured top half (the secant from the measured n nearest half
of it, never below 0), and with the prior's slope while only one n is measured; below the
smallest it is that one's. c, the cost of a prompt token beyond one token a sequence, is a moving
average of (measured − D(n)) / extra tokens over steps with at least MIN_PREFILL_TOKENS of them.
Until a step is measured, the prior (`StepPrior`; DEFAULT_PRIOR for a policy built without
start-up timings: tests and simulations, since an engine with the policy on always times its steps
first) answers. Each measurement is capped at CAP_FACTOR times the
current estimate, so one stall of the host (a collection, a page fault) moves the estimate by a
bounded step instead of a jump.

Timed at start-up (`seed`, startup_timings.py: a decode step at every size the engine may run,
alone on the device, and a prompt token's cost) the model takes the timings' shape and the live
steps' level instead:

    D(n) = T(n) · r

T(n) the timings (made non-decreasing in n: a size timed slower than a larger one was held up
by something else, and takes the larger one's time; interpolated between timed sizes; never past
the largest, which is max_num_seqs; below the smallest, the smallest's) and r the moving average of live ÷ timed over
the decode steps the engine runs (1 until one ran; each sample capped at CAP_FACTOR times r, as
steps are above). No spread is added: what a step's variation costs a listener shows in its lead,
which the stream limit reads (stream_limit.py), and a model planned for its slowest steps parked
and triaged streams a GPU at a third of its real-time step was serving whole (issue 59, H100). A live step is the timed one plus what the loop adds around it
(scheduling, output processing) and what shares its device or cores (Stage 1's threads, the
server, on a small host most of it): both grow with the load and move together across sizes,
so a size the engine has not run yet is predicted at the level of the sizes it runs now, and a
host that turns out slower than its timings says so after a few steps, not after it ran every
size. c starts from the timed token cost and learns from live steps as above.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

ALPHA = 0.1  # weight of a new measurement once a size has 10 (a plain mean before)
MIN_PREFILL_TOKENS = 16  # steps with fewer prompt tokens teach nothing about their cost
CAP_FACTOR = 4
SPREAD = 2  # steps are planned at mean + SPREAD x mean deviation (module note)
RATIO_BOUNDS = (1 / 16, 16.0)  # live ÷ timed beyond these is a measurement gone wrong, not a level


@dataclass(frozen=True)
class StepPrior:
    """The model before any data: base + per_seq · n + per_token · prompt tokens (µs)."""

    base_us: int
    per_seq_us: int
    per_token_us: int


# slower than any step measured so far, so an engine built without timings errs on the side of waiting
DEFAULT_PRIOR = StepPrior(base_us=20_000, per_seq_us=1_000, per_token_us=50)


class StepTimeModel:
    def __init__(self, max_num_seqs: int, prior: StepPrior):
        self.prior = prior
        self._mean_us = [0.0] * (max_num_seqs + 1)  # moving average per n
        self._deviation_us = [0.0] * (max_num_seqs + 1)  # moving average of |step - mean| per n
        self._decode_us = [0.0] * (max_num_seqs + 1)  # D(n) = mean + SPREAD x deviation
        self._counts = [0] * (max_num_seqs + 1)
        self._measured: list[int] = []  # the n with data, ascending
        self._token_us = float(prior.per_token_us)
        self._token_count = 0
        self._timed_sizes: list[int] = []  # seeded: the sizes timed at start-up, ascending
        self._timed_us: list[float] = []  # ... and their decode steps (µs)
        self._ratio = 1.0  # r: live ÷ timed (module note)
        self._ratio_count = 0  # live decode steps seen since the seed

    @property
    def token_us(self) -> int:
        """Predicted cost of one prompt token (µs)."""
        return max(1, int(self._token_us))

    def seed(self, decode_us: Mapping[int, int], token_us: int) -> None:
        """Take the shape of the steps timed at start-up: a decode of n sequences (µs) for each
        size timed, and a prompt token's cost (module note)."""
        timed = sorted((n, us) for n, us in decode_us.items() if 0 < n < len(self._counts) and us > 0)
        self._timed_sizes = [n for n, _ in timed]
        self._timed_us = [float(us) for _, us in timed]
        for i in range(len(timed) - 2, -1, -1):  # non-decreasing: each at most the next larger's
            self._timed_us[i] = min(self._timed_us[i], self._timed_us[i + 1])
        if token_us > 0:
            self._token_us = float(token_us)

    @property
    def seeded(self) -> bool:
        return bool(self._timed_sizes)

    def _timed_at(self, n: int) -> float:
        """T(n): the start-up timings, interpolated between timed sizes."""
        sizes, times = self._timed_sizes, self._timed_us
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            return times[i]
        if i == 0:
            return times[0]
        if i == len(sizes):
            return times[-1]
        lo, hi = sizes[i - 1], sizes[i]
        return times[i - 1] + (times[i] - times[i - 1]) * (n - lo) / (hi - lo)

    def observe(self, num_seqs: int, num_tokens: int, elapsed_us: int) -> None:
        """One measured step: `num_seqs` sequences, `num_tokens` tokens in all."""
        if not 0 < num_seqs < len(self._counts) or elapsed_us <= 0:
            return
        extra = num_tokens - num_seqs
        if extra == 0:
            self._observe_decode(num_seqs, elapsed_us)
        elif extra >= MIN_PREFILL_TOKENS:
            per_token = max(0.0, elapsed_us - self.mean_decode_us(num_seqs)) / extra
            self._token_count += 1
            alpha = max(ALPHA, 1.0 / self._token_count)
            self._token_us += alpha * (min(per_token, CAP_FACTOR * self._token_us) - self._token_us)

    def _observe_decode(self, n: int, elapsed_us: int) -> None:
        if self._timed_sizes:  # the timings' shape, the live level: no per-size averages to keep
            self._observe_ratio(n, elapsed_us)
            return
        count = self._counts[n] = self._counts[n] + 1
        if count == 1:
            first = float(min(elapsed_us, CAP_FACTOR * self.decode_us(n)))
            bisect.insort(self._measured, n)
            self._mean_us[n] = self._decode_us[n] = first
            return
        mean = self._mean_us[n]
        x = min(elapsed_us, CAP_FACTOR * mean)
        alpha = max(ALPHA, 1.0 / count)
        self._deviation_us[n] += alpha * (abs(x - mean) - self._deviation_us[n])
        self._mean_us[n] = mean + alpha * (x - mean)
        self._decode_us[n] = self._mean_us[n] + SPREAD * self._deviation_us[n]

    def _observe_ratio(self, n: int, elapsed_us: int) -> None:
        lo, hi = RATIO_BOUNDS
        x = min(hi, max(lo, elapsed_us / self._timed_at(n)))
        self._ratio_count = count = self._ratio_count + 1
        if count == 1:
            self._ratio = x
            return
        alpha = max(ALPHA, 1.0 / count)
        self._ratio += alpha * (min(x, CAP_FACTOR * self._ratio) - self._ratio)

    def predict_us(self, num_seqs: int, num_tokens: int) -> int:
        """Predicted wall time of a step of `num_seqs` sequences and `num_tokens` tokens (µs)."""
        extra = max(0, num_tokens - num_seqs)
        return int(self.decode_us(num_seqs) + extra * self._token_us)

    def tokens_within(self, extra_us: int) -> int:
        """Prompt tokens a step may add for `extra_us` more time."""
        return max(0, int(extra_us / max(self._token_us, 1e-3)))

    def decode_us(self, n: int) -> float:
        """D(n) (module note)."""
        if self._timed_sizes:
            return self._timed_at(n) * self._ratio
        measured = self._measured
        if not measured:
            return self.prior.base_us + self.prior.per_seq_us * n
        i = bisect.bisect_left(measured, n)
        if i < len(measured) and measured[i] == n:
            return self._decode_us[n]
        if i == 0:
            return self._decode_us[measured[0]]
        lo = measured[i - 1]
        if i < len(measured):
            hi = measured[i]
            return self._decode_us[lo] + (self._decode_us[hi] - self._decode_us[lo]) * (n - lo) / (hi - lo)
        return self._decode_us[lo] + self._slope_above() * (n - lo)

    def mean_decode_us(self, n: int) -> float:
        """The moving average alone at n where measured (D(n) elsewhere; timed: T(n) · r)."""
        if self._timed_sizes:
            return self._timed_at(n) * self._ratio
        return self._mean_us[n] if 0 <= n < len(self._counts) and self._counts[n] else self.decode_us(n)

    def _slope_above(self) -> float:
        """µs per extra sequence above the largest measured size (module note)."""
        measured = self._measured
        top = measured[-1]
        if len(measured) == 1:
            return float(self.prior.per_seq_us)
        j = min(bisect.bisect_left(measured, top // 2), len(measured) - 2)
        mid = measured[j]
        return max(0.0, (self._decode_us[top] - self._decode_us[mid]) / (top - mid))
