"""The slack-first policy Stage 0's scheduler follows (its contract: engine/scheduler.py;
docs/architecture.md#deadlines).

Two classes of request, told apart by `Request.playback` alone:
- STREAM: heard by a real-time player (`Request.playback`, a playback clock). Its slack, µs:
      slack = deadline − now − (rows until its next window · step + prompt tokens left · token cost
                                + Stage 1's latency)
  where step is the step model's time of the current step (step_model.py) and Stage 1's latency
  is measured (stage1_load.py).
- BULK: no deadline (`stream: false`, batch items, long-form files, `synth`). Its slack counts as
  BULK_SLACK, after every stream's: it fills what the streams leave.

The scheduler asks, once per step:
- `choose_decodes`: every running decode, while Stage 0's predicted step of all of them keeps every
  stream ahead of real time (`AdmissionRule.step_target_us`): an O(1) check, the only cost at low
  load. Past it, slack first: the streams with less slack than `park_slack_ms` always; then the
  others (well-buffered streams, then bulk requests) while the step stays within the real-time
  step, or within the step those streams need plus the smallest share among them (a stream's
  slack spread over the steps before its next audio: the step may grow by that much every step
  without making it late). A stream left out keeps its rows, slot and KV; its slack shrinks by a
  step each time, so it is back in before its listener runs dry. Sampling depends only on a
  request's seed and row index (docs/model.md#sampling), so sitting out steps never changes its
  audio.
- `order_prompts`: unfinished prompts by slack (streams' first-audio deadlines first, bulk last).
- `prompt_token_cap`: prompt tokens that fit in the smallest share of the step's streams
  (at least `min_prefill_chunk_tokens`), so a long prompt (a clone reference, a long-form segment,
  a WebSocket sentence) is chunked rather than stalling a stream.
- `next_admission`: the first waiting stream while fewer streams run than the stream limit
  allows (stream_limit.py: started at the capacity the engine timed at start-up, `seed`, and
  steered by the leads its listeners report, `observe_lead`); else the first waiting bulk
  request, while a free slot remains for every waiting stream. So a prediction holds a stream
  back only when every place under the limit is taken or the measured leads are falling.
- past real time (`choose_decodes` when even the streams with little slack cannot keep real time
  together): triage, as many as keep it, listeners not yet behind first, oldest first.
At arrival (`on_arrival`) a stream gets its first-audio deadline, and one whose predicted first
audio (its wait for a place under the limit + prompt + first window) is past its `ttfa_budget`
is refused at once (`OverCapacityError`, with the seconds until it would fit); one that may wait gets the time by
which it must have its place (`PlaybackClock.admit_by_us`: its budget less its predicted prompt
and first window), past which its caller withdraws it (the server: a 503 then). With
`enabled: false` every answer is the first-come-first-served one (every decode, prompts in
admission order, no cap, the queue's head, no refusal).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from higgs_serve.codec.chunker import WindowParams, ramp_initial_frames
from higgs_serve.config.deploy import DeadlineConfig
from higgs_serve.engine.deadlines.admission import PPM, AdmissionRule, predicted_wait_us
from higgs_serve.engine.deadlines.playback_clock import STALL_US, US_PER_S, now_us
from higgs_serve.engine.deadlines.stage1_load import Stage1Load
from higgs_serve.engine.deadlines.startup_timings import StartupTimings
from higgs_serve.engine.deadlines.step_model import DEFAULT_PRIOR, StepTimeModel
from higgs_serve.engine.deadlines.stream_limit import StreamLimit
from higgs_serve.engine.request import TAIL_ROWS
from higgs_serve.errors import OverCapacityError

if TYPE_CHECKING:
    from higgs_serve.engine.request import Request

FRAME_US = 40_000  # one codec frame's playback at 1x (25 frames a second)
BULK_SLACK = 1 << 62  # after every stream's slack
# a running request past its expected length: assume about this many more rows (a second)
RUNOVER_ROWS = 25


class SlackPolicy:
    def __init__(self, config: DeadlineConfig, max_num_seqs: int, stage1: Stage1Load | None = None,
                 clock: Callable[[], int] = now_us, synchronous_steps: bool = False):
        """`clock`: the time in µs (tests pass their own). `synchronous_steps`: the runner computes
        a step inside `launch` (CPU), so the time between two collects is the later plan's."""
        self.enabled = config.enabled
        self.config = config
        self.max_num_seqs = max_num_seqs
        self.model = StepTimeModel(max_num_seqs, DEFAULT_PRIOR)
        self.rule = AdmissionRule(FRAME_US, int(config.realtime_headroom * PPM))
        self.stage1 = stage1 if stage1 is not None else Stage1Load(())
        self.now_us = clock
        self.synchronous_steps = synchronous_steps
        self.park_us = config.park_slack_ms * 1000
        self.target_us = self.rule.step_target_us()
        self.num_decoding = 0  # decodes in the last step chosen
        self.num_streams = 0  # streams running (admitted): the scheduler counts them here
        # how many streams run at once: the start-up capacity, then the listeners' leads
        self.limit = StreamLimit(max_num_seqs, config.lead_margin_ms * 1000)

    # ------------------------------------------------------------------ slack
    def slacks(self, requests: Sequence[Request], step_us: int) -> list[tuple[int, int, int]]:
        """(slack, share, index) of each request, now (module note). Its share is what each of
        the steps before its next audio may run longer than predicted without making it late:
        its slack spread over them. A request without a deadline: BULK_SLACK for both. One tight
        pass (it runs for every stream of a step at load)."""
        base = self.now_us() + self.stage1.latency_us
        token_us = self.model.token_us
        out = []
        add = out.append
        for i, request in enumerate(requests):
            clock = request.playback
            if clock is None:
                add((BULK_SLACK, BULK_SLACK, i))
                continue
            rows = clock.due_rows - request.num_rows - request.num_pending_rows
            rows = rows if rows > 0 else 0
            prompt = request.num_prompt_tokens - request.num_computed_tokens
            if prompt > 0:
                slack = clock.deadline_us() - base - rows * step_us - prompt * token_us
                add((slack, (slack if slack > 0 else 0) // (rows + 2), i))
            else:
                slack = clock.deadline_us() - base - rows * step_us
                add((slack, (slack if slack > 0 else 0) // (rows + 1), i))
        return out

    def slack_us(self, request: Request, step_us: int) -> int:
        """One request's slack now (BULK_SLACK without a deadline)."""
        return self.slacks((request,), step_us)[0][0]

    # ------------------------------------------------------------------ the step
    def choose_decodes(self, decodes: list[Request], num_streams: int) -> list[Request]:
        """The running decodes this step runs (module note), in their given order;
        `num_streams`: running requests with a deadline (none: nobody to serve first)."""
        n = self.num_decoding = len(decodes)
        if not self.enabled or n == 0 or num_streams == 0:
            return decodes
        step = self.model.predict_us(n, n)
        if step <= self.target_us:
            return decodes
        keyed = sorted(self.slacks(decodes, step))
        must = sum(1 for k in keyed if k[0] < self.park_us)
        if must == 0:  # every stream well ahead: nobody gains from a shorter step
            return decodes
        if self.model.predict_us(must, must) > self.target_us:
            return self._triage(decodes, keyed[:must])
        share = min(k[1] for k in keyed[:must])
        limit_us = max(self.target_us, self.model.predict_us(must, must) + share)
        chosen, most = must, n  # the most decodes whose step stays within the limit (a bisection)
        while chosen < most:
            mid = (chosen + most + 1) // 2
            if self.model.predict_us(mid, mid) <= limit_us:
                chosen = mid
            else:
                most = mid - 1
        self.num_decoding = chosen
        if chosen == n:
            return decodes
        picked = sorted(i for _, _, i in keyed[:chosen])
        return [decodes[i] for i in picked]

    def _triage(self, decodes: list[Request], urgent: list[tuple[int, int, int]]) -> list[Request]:
        """More streams need this step than keep real time together (the device slowed, or the
        limit overshot a burst): least slack first would make every one of them late. Instead as
        many as keep real time run: first those whose listeners have not fallen behind (a player
        more than STALL_US dry), oldest first, so a stable set stays whole; the rest sit the step
        out (a stream before its first audio only starts later) and join as others end or build
        their buffer past park_slack_ms."""
        now = self.now_us()

        def key(entry: tuple[int, int, int]) -> tuple[bool, int]:
            clock = decodes[entry[2]].playback
            return clock.started and clock.deadline_us() - now < -STALL_US, entry[2]

        fits, most = 1, len(urgent)  # the most that keep real time (a bisection)
        while fits < most:
            mid = (fits + most + 1) // 2
            if self.model.predict_us(mid, mid) <= self.target_us:
                fits = mid
            else:
                most = mid - 1
        self.num_decoding = fits
        return [decodes[i] for i in sorted(i for _, _, i in sorted(urgent, key=key)[:fits])]

    def order_prompts(self, prefilling: list[Request]) -> list[Request]:
        """Unfinished prompts, least slack first (stable: admission order among equals)."""
        if not self.enabled or len(prefilling) < 2:
            return prefilling
        step = self.model.predict_us(self.num_decoding, self.num_decoding)
        return [prefilling[i] for _, _, i in sorted(self.slacks(prefilling, step))]

    def prompt_token_cap(self, decodes: list[Request]) -> int | None:
        """Most prompt tokens this step may hold (None: no cap): what fits in the smallest share
        of the streams it decodes (`slacks`), at least `min_prefill_chunk_tokens`."""
        if not self.enabled:
            return None
        share = min((k[1] for k in self.slacks(decodes, self.model.predict_us(len(decodes), len(decodes)))),
                    default=BULK_SLACK)
        if share == BULK_SLACK:  # no stream in the step
            return None
        return max(self.config.min_prefill_chunk_tokens, self.model.tokens_within(share))

    def observe_step(self, num_seqs: int, num_tokens: int, elapsed_us: int) -> None:
        self.model.observe(num_seqs, num_tokens, elapsed_us)

    # ------------------------------------------------------------------ admission
    def observe_lead(self, at_us: int, lead_us: int, losing: bool) -> None:
        """A stream's chunk left with its listener `lead_us` ahead, losing ground or not
        (engine/output_processor.py `lead_report`; any thread)."""
        self.limit.observe(at_us, lead_us, losing)

    def seed(self, timings: StartupTimings) -> None:
        """Start from what the engine timed at start-up (engine/deadlines/startup_timings.py):
        the step model's sizes and token cost, Stage 1's cost per window batch, and the stream
        limit from the capacity they give."""
        self.model.seed(timings.decode_us, timings.token_us)
        self.stage1.seed(timings.stage1_ppm)
        self.limit.seed(self.predicted_capacity(()))

    def next_admission(self, waiting: Sequence[Request], running: Sequence[Request],
                       free_slots: int) -> Request | None:
        """The waiting request to try next (module note), or None: nothing may start now."""
        if not self.enabled:
            return waiting[0]
        stream = next((r for r in waiting if r.playback is not None), None)
        if stream is not None and self._streams(running) < self.stream_limit(running, waiting):
            return stream
        bulk = next((r for r in waiting if r.playback is None), None)
        if bulk is None:
            return None
        return bulk if free_slots > self._streams(waiting) else None

    def stream_limit(self, running: Sequence[Request], waiting: Sequence[Request] = ()) -> int:
        """How many streams may run at once now (stream_limit.py: steered by the leads)."""
        if not self.enabled:
            return self.max_num_seqs
        return self.limit.update(self.now_us(), self._streams(running), self._streams(waiting),
                                 lambda: self.predicted_capacity(running))

    def limit_stats(self, running: Sequence[Request]) -> dict[str, float]:
        """The stream limit as metrics read it (no decision is taken here)."""
        state = self.limit.state(self.now_us())
        return {"stream_capacity": state.limit if self.enabled else self.max_num_seqs,
                "stream_capacity_predicted": self.predicted_capacity(running),
                "stream_lead_tail_seconds": (state.tail_us or 0) / US_PER_S,
                **{f"stream_limit_changes:{kind}": n for kind, n in self.limit.changes.items()}}

    def predicted_capacity(self, running: Sequence[Request]) -> int:
        """Streams the measured step times and Stage 1 costs say fit real time at once
        (admission.py; at most max_num_seqs)."""
        speed = max((r.playback.speed for r in running if r.playback is not None), default=1.0)
        return self.rule.capacity(lambda n: self.model.predict_us(n, n), self.stage1.cost_ppm_at,
                                  self.max_num_seqs, speed)

    @staticmethod
    def _streams(requests: Sequence[Request]) -> int:
        return sum(1 for r in requests if r.playback is not None)

    def on_arrival(self, request: Request, running: Sequence[Request], waiting: Sequence[Request]) -> None:
        """Set a stream's first-audio deadline; refuse it (OverCapacityError) when it cannot start
        within its budget: every place under the limit is taken and none opens in time."""
        clock = request.playback
        if clock is None:
            return
        if clock.first_audio_due_us is None:
            clock.first_audio_due_us = clock.submitted_us + self.config.first_audio_target_ms * 1000
        if not self.enabled or clock.ttfa_budget_us is None or not any(
                r.playback is not None for r in (*running, *waiting)):
            return  # an engine without streams starts it at once
        wait_us, ttfa_us = self.predicted_ttfa_us(request, running, waiting)
        # admitted later than this, its first audio (its prompt and first window) is past the budget
        clock.admit_by_us = clock.submitted_us + clock.ttfa_budget_us - (ttfa_us - wait_us)
        # one that would start at once is never refused: waiting cannot make it sooner
        if wait_us > 0 and ttfa_us > clock.ttfa_budget_us:
            self.limit.refused(self.now_us())
            retry_s = max(1, math.ceil((ttfa_us - clock.ttfa_budget_us) / US_PER_S))
            raise OverCapacityError(
                f"the server is speaking as many streams as it can in real time; this one would wait "
                f"about {ttfa_us / US_PER_S:.1f} s for its first audio, past the server's "
                f"{clock.ttfa_budget_us / US_PER_S:g} s budget: retry in {retry_s} s", retry_s)

    def retry_after_s(self, running: Sequence[Request], waiting: Sequence[Request]) -> int:
        """Seconds until a place under the stream limit opens for a stream arriving now (at least
        1): the Retry-After of a stream withdrawn from the queue."""
        wait, _ = self._place_wait_us(running, waiting)
        return max(1, math.ceil(wait / US_PER_S))

    def predicted_ttfa_us(self, request: Request, running: Sequence[Request],
                          waiting: Sequence[Request]) -> tuple[int, int]:
        """(its wait for a place (`_place_wait_us`), the wait + its prompt + its first window's
        rows + Stage 1's latency)."""
        wait, step = self._place_wait_us(running, waiting)
        first_window = max(request.playback.due_rows, 1) * step
        return wait, wait + request.num_prompt_tokens * self.model.token_us + first_window + self.stage1.latency_us

    def _place_wait_us(self, running: Sequence[Request], waiting: Sequence[Request]) -> tuple[int, int]:
        """(how long a stream arriving now waits for a place under the stream limit, the step
        predicted meanwhile): the places open as running streams end at the measured step and the
        streams queued ahead take them in turn (admission.py `predicted_wait_us`)."""
        limit = self.stream_limit(running, waiting)
        streams = [r for r in running if r.playback is not None]
        queued = [r for r in waiting if r.playback is not None]
        n = min(limit, len(streams) + len(queued) + 1)  # streams decoding meanwhile
        step = self.model.predict_us(n, n)
        ends = [self._rows_left(r) * step for r in streams]
        ahead = [self._expected_rows(r) * step + r.num_prompt_tokens * self.model.token_us for r in queued]
        return predicted_wait_us(ends, ahead, limit - len(streams)), step

    @staticmethod
    def _expected_rows(request: Request) -> int:
        return min(request.expected_frames + TAIL_ROWS, request.max_num_rows)

    def _rows_left(self, request: Request) -> int:
        left = self._expected_rows(request) - request.num_rows
        return left if left > 0 else min(RUNOVER_ROWS, request.max_num_rows - request.num_rows)

    # ------------------------------------------------------------------ the first chunk
    def stream_window(self, profile: WindowParams, speed: float) -> WindowParams:
        """The profile's window with the first chunk the load needs (codec/chunker.py
        `ramp_initial_frames`): planned for the streams running or decoding now and this one, or
        the most held at once lately when more (at most the stream limit), so the streams of a
        burst that arrives after a busy spell start with ramps that hold once all of them run.
        (Output processing asks again at a stream's first row, when it runs itself.)"""
        if not (self.enabled and self.config.first_chunk_follows_load):
            return profile
        load = max(self.num_decoding + 1, self.num_streams + 1, self.limit.recent_peak(self.now_us()))
        n = min(self.limit.limit, load)
        frame_us = int(FRAME_US / speed)
        first = ramp_initial_frames(profile, self.model.predict_us(n, n), frame_us,
                                    self.stage1.us_per_frame(frame_us), self.stage1.jitter_us)
        if first == profile.threshold(0):
            return profile
        return WindowParams(profile.chunk_frames, profile.left_context_frames, profile.right_holdback_frames,
                            first, profile.chunk_doubling)
