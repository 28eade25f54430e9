"""Stage 0 scheduler: continuous batching, token budget, chunked prefill, admission, deadlines.
Ints only.

There are no prefill and decode phases: each request's `num_computed_tokens` catches up to its
`num_tokens` (prompt + sampled rows, see request.py). Each `schedule()` hands out at most
`max_num_batched_tokens` tokens to at most `max_num_seqs` requests, in this order:

1. running requests whose prompt is computed (decodes: 1 token each, the previous row);
2. running requests still in their prompt (one chunk each, budget allowing);
3. waiting requests (admissions), each class first come first served: the head of a class's
   queue blocks those behind it, so a long prompt is never starved by a stream of short ones.

Deadlines (the policy: engine/deadlines/slack_policy.py; docs/architecture.md#deadlines). A
request is a STREAM (heard by a real-time player: `Request.playback`, its playback clock) or BULK
(no deadline: files, batch items, long-form files, `synth`). A stream's slack (µs) is its
listener's deadline less now less the work before its next audio can leave; BULK comes after
every stream. The policy decides, in µs and counts only:
- which decodes run: all of them while the step-time model predicts that a step of all of them
  keeps every stream ahead of real time (an O(1) check: the low-load path costs nothing more);
  past that, streams with little slack always, then well-buffered streams and bulk requests while
  the step stays within the real-time step or within the tightest slack; when even the streams
  with little slack cannot keep real time together, as many as can, those not yet behind first,
  oldest first (triage). A request left out of a
  step keeps its slot, rows and KV; its audio does not change (sampling depends on its seed and
  row index only, docs/model.md#sampling);
- the order of unfinished prompts (least slack first) and the prompt tokens a step may hold (what
  fits in the tightest slack of the step's streams, at least a floor), so a long prompt is
  chunked instead of stalling a stream;
- which waiting request is admitted: the first stream while fewer streams run than the stream
  limit allows (stream_limit.py: the capacity timed at start-up, steered by the leads listeners
  have), else the first bulk request while a free slot remains for each waiting stream;
- at `add_request`, a stream's first-audio deadline, and a refusal (`OverCapacityError`) when its
  predicted first audio is past its time-to-first-audio budget.
With the policy off (`stages[0].deadlines.enabled: false`) every answer is first come first
served: every decode, prompts in admission order, the queue's head. `update` feeds the measured
step time to the step-time model.

Decodes come before prompts and `max_num_batched_tokens >= max_num_seqs`, so a long prompt delays
running decodes by at most one chunk per step. Prompts share what the decodes leave: while more
than one prompt is in flight (prefilling, or waiting with a free slot) each takes at most an
equal share of it per step, so a short prompt never waits for a long one's whole prefill (a
lone prompt still gets the whole budget).

Memory policy: reserve on admission, no preemption. A request is admitted only when the KV blocks
of its worst-case context (`Request.max_num_tokens` = prompt + max_frames + 7 fed rows) fit
beside every other admitted request's worst case (prefix-cache hits are shared, not re-counted).
A running request can therefore always grow, so decode never runs out of blocks and nothing is
ever preempted: no generated audio row ever needs to be re-embedded for a recompute. Requests that
do not fit now wait; a request whose worst case could never fit (longer than `max_model_len`, or
more blocks than the whole pool) is rejected at `add_request` with `InvalidRequestError`. The
cost is memory held for rows that early-stopping requests never produce; with the 4B geometry
64 requests × 4k tokens is ~38 GB of KV, affordable on the target GPU.

Pipelining: `num_computed_tokens` advances when a chunk is scheduled and a sampled row counts as
pending until its result arrives, so the engine may call `schedule()` for step N+1 before
`update()` of step N (results must be applied in plan order). Slots are assigned on first
schedule and returned in the next plan's `released_slots` after finish or abort; that same plan
may hand the slot to a new request (the runner frees released slots before adding new ones).
"""

from __future__ import annotations

import heapq
from collections import deque

from higgs_serve.config.deploy import DeadlineConfig
from higgs_serve.engine.deadlines.slack_policy import SlackPolicy
from higgs_serve.engine.kv_cache_manager import KVCacheManager
from higgs_serve.worker.step_contract import NewRequestData, ScheduledChunk, StepPlan, StepResult
from higgs_serve.engine.request import Request, RequestStatus
from higgs_serve.errors import ConfigError, InputTooLongError, InvalidRequestError


class Scheduler:
    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        kv: KVCacheManager,
        enable_prefix_caching: bool,
        policy: SlackPolicy | None = None,
    ):
        """`policy`: the deadline policy (default: the deploy config's defaults, its own clocks)."""
        if max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                f"({max_num_seqs}) so every running decode fits in one step"
            )
        if max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {max_model_len}")
        if enable_prefix_caching != kv.enable_prefix_caching:
            raise ConfigError(
                f"enable_prefix_caching={enable_prefix_caching} but the KV cache manager was built "
                f"with enable_prefix_caching={kv.enable_prefix_caching}"
            )
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.kv = kv
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self._free_slots = list(range(max_num_seqs))  # a heap: lowest slot first
        self._released_slots: list[int] = []  # to report in the next plan
        self._next_step_id = 0
        self.policy = policy if policy is not None else SlackPolicy(DeadlineConfig(), max_num_seqs)
        self._shapes: dict[int, tuple[int, int]] = {}  # step id -> (sequences, tokens) until update

    # ----- queue state
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_running_streams(self) -> int:
        """Running requests with a playback clock (a deadline): the policy's count, which plans
        first chunks by it."""
        return self.policy.num_streams

    @num_running_streams.setter
    def num_running_streams(self, value: int) -> None:
        self.policy.num_streams = value

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ----- requests in and out
    def add_request(self, request: Request) -> None:
        """Queue a request, or raise InvalidRequestError if it could never run (OverCapacityError
        for a stream whose first audio would be past its budget)."""
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use")
        if request.status is not RequestStatus.WAITING or request.num_computed_tokens:
            raise InvalidRequestError(f"request {request.request_id} was already scheduled")
        # client-facing messages: no request ids (internal), the field to change named
        tail_rows = request.max_num_rows - request.max_frames
        if request.num_prompt_tokens + tail_rows + 1 > self.max_model_len:
            raise InputTooLongError(
                f"the prompt is {request.num_prompt_tokens} tokens (the input, plus the reference "
                f"clip when cloning); at most {self.max_model_len - tail_rows - 1} leave room to "
                "speak: shorten the input or the reference", "input")
        worst_len = request.num_prompt_tokens + request.max_num_rows
        if worst_len > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({request.num_prompt_tokens} tokens) + max_frames ({request.max_frames}) "
                f"+ {tail_rows} tail rows = {worst_len} exceeds max_model_len "
                f"({self.max_model_len}); lower max_new_tokens", "max_new_tokens")
        worst_blocks = self.kv.num_blocks_for(request.max_num_tokens)
        if worst_blocks > self.kv.num_usable_blocks:
            raise InvalidRequestError(
                f"the request needs {worst_blocks} KV blocks in the worst case but the cache has "
                f"{self.kv.num_usable_blocks}; lower max_new_tokens or the input",
                "max_new_tokens",
            )
        self.policy.on_arrival(request, self.running, self.waiting)  # may refuse: OverCapacityError
        request.block_keys = self.kv.block_keys(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Drop a request now: its blocks are freed and its slot is in the next plan.

        Returns False when the request is unknown or already finished (aborts race finishes)."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
            del self.requests[request_id]
            request.status = RequestStatus.FINISHED_ABORTED
        else:
            self.running.remove(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED)
        return True

    # ----- the step
    def schedule(self) -> StepPlan | None:
        """The next step's plan, or None when there is nothing to compute."""
        budget = self.max_num_batched_tokens
        decodes, prefilling = self._running_by_phase()
        decodes = self.policy.choose_decodes(decodes, self.num_running_streams)
        chunks = [self._schedule_chunk(request, 1) for request in decodes]  # the previous row each
        budget -= len(chunks)
        if self.num_running_streams and (prefilling or (self.waiting and self._free_slots)):
            cap = self.policy.prompt_token_cap(decodes)
            budget = budget if cap is None else min(budget, cap)
        share = self._prefill_share(budget, len(prefilling))
        for request in self.policy.order_prompts(prefilling):  # then unfinished prompts
            if budget == 0:
                break
            num_new = min(request.num_prompt_tokens - request.num_computed_tokens, budget, share)
            chunks.append(self._schedule_chunk(request, num_new))
            budget -= num_new
        new_requests: list[NewRequestData] = []
        while budget > 0 and self.waiting and self._free_slots:  # then admissions
            request = self.policy.next_admission(self.waiting, self.running, len(self._free_slots))
            if request is None or (num_new := self._admit(request, min(budget, share))) == 0:
                break  # nothing may start, or the head does not fit: later requests wait behind it
            self.waiting.remove(request)
            new_requests.append(self._new_request_data(request))
            chunks.append(self._schedule_chunk(request, num_new))
            budget -= num_new
        if not chunks:
            return None
        plan = StepPlan(
            step_id=self._next_step_id,
            new_requests=tuple(new_requests),
            chunks=tuple(chunks),
            released_slots=tuple(self._released_slots),
        )
        self._shapes[plan.step_id] = (len(chunks), self.max_num_batched_tokens - budget)
        self._next_step_id += 1
        self._released_slots.clear()
        return plan

    def _running_by_phase(self) -> tuple[list[Request], list[Request]]:
        """(decodes, unfinished prompts) among the running requests, in admission order."""
        decodes: list[Request] = []
        prefilling: list[Request] = []
        for request in self.running:
            if request.num_computed_tokens < request.num_prompt_tokens:
                prefilling.append(request)
            elif request.num_rows + request.num_pending_rows < request.max_num_rows:
                decodes.append(request)  # num_tokens - num_computed_tokens is 1, the last sampled row
        return decodes, prefilling

    def update(self, plan: StepPlan, result: StepResult, elapsed_us: int | None = None) -> list[Request]:
        """Apply one step's result (in plan order); returns the requests finished by it.
        `elapsed_us`: the step's measured wall time (the step-time model learns from it)."""
        if plan.step_id != result.step_id:
            raise RuntimeError(
                f"StepResult {result.step_id} does not answer StepPlan {plan.step_id}"
            )
        self._measure(plan.step_id, elapsed_us)
        rows = result.rows
        capped: list[Request] = []
        for chunk in plan.chunks:
            request = self.requests.get(chunk.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted or finished while this plan was in flight
            if chunk.start_pos < request.num_prompt_tokens:  # only prompt blocks are cacheable
                self.kv.cache_blocks(request, chunk.start_pos + chunk.num_tokens)
            if not chunk.samples:
                continue
            if chunk.request_id not in rows:
                raise RuntimeError(
                    f"StepResult {result.step_id} has no row for request {chunk.request_id}, "
                    f"whose chunk samples"
                )
            request.num_pending_rows -= 1
            request.num_rows += 1
            if request.num_rows >= request.max_num_rows:
                capped.append(request)
        finished: list[Request] = []
        for request_id in result.finished:
            request = self.requests.get(request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                self._finish(request, RequestStatus.FINISHED_STOPPED)
                finished.append(request)
        for request in capped:  # safety net: the runner should have stopped it at this row
            if request.status is RequestStatus.RUNNING:
                self._finish(request, RequestStatus.FINISHED_LENGTH)
                finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return finished

    # ----- helpers
    def _measure(self, step_id: int, elapsed_us: int | None) -> None:
        """Teach the step-time model: the time between two collects is this plan's on a device
        that runs asynchronously, the next plan's when `launch` computes (the CPU)."""
        shape = self._shapes.pop(step_id, None)
        if elapsed_us is None:
            return
        if self.policy.synchronous_steps:
            shape = self._shapes.get(step_id + 1)
        if shape is not None:
            self.policy.observe_step(*shape, elapsed_us)

    def _prefill_share(self, budget: int, num_prefilling: int) -> int:
        """Most prompt tokens one request gets this step: the whole budget when it is the only
        prompt in flight, else an equal share, so a short prompt arriving behind a long one is
        admitted in the next step instead of after the long prompt's last chunk."""
        contenders = num_prefilling + min(len(self.waiting), len(self._free_slots))
        return budget if contenders <= 1 else max(1, -(-budget // contenders))

    def _admit(self, request: Request, budget: int) -> int:
        """Take KV blocks for the queue head; returns its first chunk size, 0 if it does not fit."""
        computed_blocks, num_computed = self.kv.get_computed_blocks(request)
        num_new = min(request.num_prompt_tokens - num_computed, budget)
        table = self.kv.allocate(
            request, computed_blocks, num_computed + num_new, request.max_num_tokens
        )
        if table is None:
            return 0
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed
        request.slot = heapq.heappop(self._free_slots)
        self.running.append(request)
        if request.playback is not None:
            request.playback.admitted_us = self.policy.now_us()  # its queue wait ends
            self.num_running_streams += 1
        return num_new

    def _schedule_chunk(self, request: Request, num_new: int) -> ScheduledChunk:
        start_pos = request.num_computed_tokens
        end_pos = start_pos + num_new
        block_ids = self.kv.allocate_slots(request.request_id, end_pos)
        if block_ids is None:  # impossible under reserve-on-admission: a bookkeeping bug
            raise RuntimeError(f"request {request.request_id} outgrew its KV reservation")
        samples = end_pos >= request.num_prompt_tokens
        request.num_computed_tokens = end_pos
        if samples:
            request.num_pending_rows += 1
        return ScheduledChunk(
            request_id=request.request_id,
            slot=request.slot,
            start_pos=start_pos,
            num_tokens=num_new,
            block_ids=block_ids,
            samples=samples,
        )

    @staticmethod
    def _new_request_data(request: Request) -> NewRequestData:
        return NewRequestData(
            request_id=request.request_id,
            slot=request.slot,
            prompt_token_ids=request.prompt_token_ids,
            placeholder_rows=request.placeholder_rows,
            placeholder_start=request.placeholder_start,
            sampling=request.sampling,
            max_frames=request.max_frames,
            min_frames=request.min_frames,
        )

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Free a running request's blocks and slot; the caller removes it from `running`."""
        request.status = status
        del self.requests[request.request_id]
        self.num_running_streams -= request.playback is not None
        self.kv.free(request.request_id)
        heapq.heappush(self._free_slots, request.slot)
        self._released_slots.append(request.slot)
