"""A simulated engine with a known step time, for the deadline policy's admission (issue 59).

The real scheduler, deadline policy, output processing (window rule, playback clocks, the leads
it reports) run on a simulated clock; only the devices are replaced: a step of n decodes and p
prompt tokens takes `step_base_us + step_per_seq_us · n + token_us · p`, and a codec window
reaches its listener `stage1_us` after the step that completed it (a fake codec). Chunks count
as heard when they reach the sink (no server reports sends here). Closed-loop clients each keep one stream going
(`clients`: the count of clients from each time on, a jump is a burst); a refused client waits its
Retry-After, a withdrawn one (still queued when its first audio could no longer come within its
budget, the server's 503) waits its budget, as bench_serving's clients do. Listeners are judged
as bench_serving judges them: a stream stalls when a chunk finds its listener more than 100 ms
behind; goodput is the audio of streams that never stall.

Everything is deterministic: the same config gives the same run, in milliseconds of CPU per
simulated second.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from higgs_serve.codec.chunker import WindowParams
from higgs_serve.config.deploy import DeadlineConfig
from higgs_serve.engine.deadlines.playback_clock import Playback, PlaybackClock
from higgs_serve.engine.deadlines.slack_policy import SlackPolicy
from higgs_serve.engine.deadlines.startup_timings import StartupTimings
from higgs_serve.engine.kv_cache_manager import KVCacheManager
from higgs_serve.engine.output_processor import OutputProcessor
from higgs_serve.engine.request import Request
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.engine.scheduler import Scheduler
from higgs_serve.errors import OverCapacityError
from higgs_serve.worker.step_contract import StepResult

US = 1_000_000
SAMPLES_PER_FRAME = 960
STALL_US = 100_000
NUM_CODEBOOKS = 8
ROW = np.full(NUM_CODEBOOKS, 5, np.int64)  # never the EOC code: every stream speaks its whole length
# the default profile's window: 1-frame first chunk, doubling to 25-frame chunks
PROFILE_WINDOW = WindowParams(25, 25, 4, 1, True)


@dataclass(frozen=True)
class SimConfig:
    max_num_seqs: int = 64
    step_base_us: int = 4_000
    step_per_seq_us: int = 120
    token_us: int = 20
    stage1_us: int = 5_000
    prompt_tokens: int = 40
    frames: int = 250  # 10 s streams
    ttfa_budget_s: float = 1.0
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)
    # the policy starts from these timings (the engine's start-up timing); False: from its prior
    timed_at_start: bool = True
    # the start-up timings as a share of the true step times (below 1: the engine timed its steps
    # alone and live steps are slower: other threads on its cores, as on a small CPU host)
    timed_share: float = 1.0
    # clients from each time on: ((t_s, clients), ...), the first at 0
    clients: tuple[tuple[float, int], ...] = ((0.0, 1),)

    def step_us(self, decodes: int, prompt_tokens: int) -> int:
        return self.step_base_us + self.step_per_seq_us * decodes + self.token_us * prompt_tokens

    def startup_timings(self) -> StartupTimings:
        sizes = sorted({1, 2, 4, 8, *range(16, self.max_num_seqs, 16), self.max_num_seqs})
        return StartupTimings({n: int(self.step_us(n, 0) * self.timed_share) for n in sizes},
                              int(self.token_us * self.timed_share))


@dataclass
class Stream:
    request: Request
    client: int
    start_us: int
    first_audio_us: int | None = None
    stalled: bool = False
    done_us: int | None = None
    deliveries: list[tuple[int, int]] = field(default_factory=list)  # (at_us, samples)


@dataclass
class SimResult:
    streams: list[Stream]
    refusals: int
    withdrawals: int
    limits: list[tuple[int, int]]  # (at_us, stream limit) once per simulated 100 ms
    end_us: int

    def audio_s_per_s(self, start_s: float, end_s: float, good_only: bool = False) -> float:
        """Audio delivered in [start_s, end_s) per second (good_only: of the good streams, those
        that completed without a stall with their first audio within the budget: goodput)."""
        lo, hi = int(start_s * US), int(end_s * US)
        samples = sum(n for s in self.streams if s.done_us is not None and not (good_only and not self.good(s))
                      for at, n in s.deliveries if lo <= at < hi)
        return samples / 24_000 / (end_s - start_s)

    budget_us: int = US

    def good(self, stream: Stream) -> bool:
        return not stream.stalled and stream.first_audio_us - stream.start_us <= self.budget_us

    def stalled_share(self, start_s: float = 0.0) -> float:
        done = [s for s in self.streams if s.done_us is not None and s.start_us >= start_s * US]
        return sum(s.stalled for s in done) / max(1, len(done))

    def ttfa_ms(self, start_s: float = 0.0) -> list[float]:
        return sorted((s.first_audio_us - s.start_us) / 1000 for s in self.streams
                      if s.first_audio_us is not None and s.start_us >= start_s * US)


class _Listener:
    """A stream's sink: each chunk is heard as it arrives (the stall rule of the module note)."""

    def __init__(self, stream: Stream, now):
        self.stream = stream
        self._now = now
        self._end_us: int | None = None  # when the listener runs out of what it got
        self.done = False

    def put(self, chunk) -> None:
        samples = chunk.audio.size
        if samples:
            at = self._now()
            stream = self.stream
            if self._end_us is None:
                stream.first_audio_us = self._end_us = at
            elif at - self._end_us > STALL_US:  # behind the 1x schedule from its first audio
                stream.stalled = True
            self._end_us += samples * US // 24_000
            stream.deliveries.append((at, samples))
        if chunk.is_final:
            self.done = True

    def fail(self, error: BaseException) -> None:
        raise error

    def finish(self, rows, frames, finish_reason, prompt_tokens) -> None:
        pass


class _FakeCodec:
    """Stage 1: a window's audio (silence of its kept frames) reaches its sink `stage1_us` later."""

    def __init__(self, sim: StreamSim):
        self._sim = sim

    def submit(self, job) -> None:
        self._sim._in_stage1(job)


class StreamSim:
    def __init__(self, config: SimConfig):
        self.config = config
        self.now = 0
        clock = self._clock
        self.policy = SlackPolicy(config.deadlines, config.max_num_seqs, clock=clock)
        if config.timed_at_start and config.deadlines.enabled:
            self.policy.seed(config.startup_timings())
        kv = KVCacheManager(config.max_num_seqs * ((config.prompt_tokens + config.frames + 16) // 16 + 2) + 1, 16,
                            enable_prefix_caching=False)
        self.scheduler = Scheduler(config.max_num_seqs, 4096, 8192, kv, False, policy=self.policy)
        self.outputs = OutputProcessor(_FakeCodec(self), PROFILE_WINDOW, PROFILE_WINDOW, True, NUM_CODEBOOKS, 1026,
                                       stream_window=self.policy.stream_window, on_lead=self.policy.observe_lead,
                                       clock=clock)
        self.streams: dict[str, Stream] = {}  # not yet finished by the engine
        self.finished: list[Stream] = []
        self._listeners: dict[str, _Listener] = {}
        self._stage1: list[tuple[int, int, object]] = []  # heap: (at_us, seq, codec job)
        self._ready: list[tuple[int, int]] = []  # heap: (at_us, client) clients about to submit
        self._clients = self._active = 0
        self._seq = 0
        self.refusals = self.withdrawals = 0
        self.limits: list[tuple[int, int]] = []

    def _clock(self) -> int:
        return self.now

    # ------------------------------------------------------------------ clients
    def _set_clients(self, count: int) -> None:
        for client in range(self._clients, count):
            heapq.heappush(self._ready, (self.now, client))
        self._clients = max(self._clients, count)  # fewer clients: the extra ones stop after their stream
        self._active = count

    def _submit(self, client: int) -> None:
        cfg = self.config
        self._seq += 1
        request_id = f"c{client}-{self._seq}"
        clock = PlaybackClock(1.0, self.now, None, int(cfg.ttfa_budget_s * US))
        request = Request(request_id, tuple(range(cfg.prompt_tokens)), sampling=None, max_frames=cfg.frames,
                          min_frames=cfg.frames, playback=clock)
        stream = Stream(request, client, self.now)
        listener = _Listener(stream, self._clock)
        speech = SpeechRequest(request_id, "", None, playback=Playback())
        self.outputs.open(speech, listener, cfg.frames, cfg.prompt_tokens, clock)
        try:
            self.scheduler.add_request(request)
        except OverCapacityError as refused:
            self.outputs.close(request_id)
            self.refusals += 1
            heapq.heappush(self._ready, (self.now + refused.retry_after_s * US, client))
            return
        self.streams[request_id] = stream
        self._listeners[request_id] = listener

    def _withdraw_late(self) -> None:
        for request in list(self.scheduler.waiting):
            at = request.playback.withdraw_at_us if request.playback is not None else None
            if at is not None and self.now >= at:
                self.scheduler.abort(request.request_id)
                self.outputs.close(request.request_id)
                stream = self.streams.pop(request.request_id)
                del self._listeners[request.request_id]
                self.withdrawals += 1
                retry = int(max(1.0, self.config.ttfa_budget_s) * US)
                heapq.heappush(self._ready, (self.now + retry, stream.client))

    # ------------------------------------------------------------------ the run
    def run(self, until_s: float) -> SimResult:
        cfg = self.config
        end = int(until_s * US)
        changes = sorted(cfg.clients)
        next_limit_sample = 0
        while self.now < end:
            while changes and changes[0][0] * US <= self.now:
                self._set_clients(changes.pop(0)[1])
            while self._ready and self._ready[0][0] <= self.now:
                _, client = heapq.heappop(self._ready)
                if client < self._active:
                    self._submit(client)
            self._withdraw_late()
            if self.now >= next_limit_sample:
                self.limits.append((self.now, self.policy.stream_limit(self.scheduler.running, self.scheduler.waiting)))
                next_limit_sample += US // 10
            plan = self.scheduler.schedule()
            if plan is None:
                self._idle_until(min([end, *(t for t, _ in self._ready[:1]), *(d[0] for d in self._stage1[:1]),
                                      *(int(t * US) for t, _ in changes[:1])]))
                continue
            prompt = sum(c.num_tokens for c in plan.chunks if c.num_tokens > 1 or not c.samples)
            decodes = len(plan.chunks) - sum(1 for c in plan.chunks if c.num_tokens > 1 or not c.samples)
            step = cfg.step_us(decodes, prompt)
            self._deliver_until(self.now + step)
            self.now += step
            rows = {c.request_id: ROW for c in plan.chunks if c.samples}
            finished = {r.request_id for r in self.scheduler.update(plan, StepResult(plan.step_id, rows, ()), step)}
            self.outputs.emit(rows, finished)
            for request_id in finished:
                self._finished(request_id)
        return SimResult(list(self.streams.values()) + self.finished, self.refusals, self.withdrawals,
                         self.limits, self.now, int(cfg.ttfa_budget_s * US))

    def _finished(self, request_id: str) -> None:
        stream = self.streams.pop(request_id)
        stream.done_us = self.now  # its last windows are on their way
        self.finished.append(stream)
        if stream.client < self._active:
            heapq.heappush(self._ready, (self.now, stream.client))

    def _idle_until(self, at_us: int) -> None:
        at_us = max(at_us, self.now + 1)
        self._deliver_until(at_us)
        self.now = at_us

    def _in_stage1(self, job) -> None:
        self._seq += 1
        heapq.heappush(self._stage1, (self.now + self.config.stage1_us, self._seq, job))

    def _deliver_until(self, until_us: int) -> None:
        """Stage 1 hands windows to their sinks up to `until_us`."""
        now = self.now
        while self._stage1 and self._stage1[0][0] <= until_us:
            at, _, job = heapq.heappop(self._stage1)
            self.now = at
            kept = max(0, len(job.frames) - job.trim_front_frames - job.trim_back_frames)
            job.deliver(job, np.zeros(kept * SAMPLES_PER_FRAME, np.float32))
        self.now = max(now, self.now)
