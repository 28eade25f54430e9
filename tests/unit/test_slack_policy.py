"""Issue 53: the slack-first policy and the admission rule, pinned at the scheduler's level with
a fake clock (µs, ints only): which decodes run, the order and size of prompt chunks, which
waiting request starts, and which stream is refused at arrival with how long to wait."""

import pytest

from higgs_serve.config.deploy import DeadlineConfig
from higgs_serve.engine.deadlines.playback_clock import PlaybackClock
from higgs_serve.engine.deadlines.slack_policy import BULK_SLACK, SlackPolicy
from higgs_serve.engine.kv_cache_manager import KVCacheManager
from higgs_serve.engine.request import Request, RequestStatus
from higgs_serve.engine.scheduler import Scheduler
from higgs_serve.errors import OverCapacityError
from higgs_serve.worker.step_contract import StepResult

MS = 1000
ROW = (5,) * 8
SAMPLES_PER_S = 24000


class FakeClock:
    def __init__(self, now_us: int = 1_000_000_000):
        self.now = now_us
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.now


def make_policy(clock: FakeClock, step_ms: dict[int, float] | None = None, **config) -> SlackPolicy:
    """A policy whose step model has measured steps of n decodes taking step_ms[n]."""
    policy = SlackPolicy(DeadlineConfig(**config), max_num_seqs=16, clock=clock)
    for n, ms in (step_ms or {}).items():
        policy.model.observe(n, n, int(ms * MS))
    return policy


def decoding(request_id: str, rows: int = 30, due_in_rows: int = 5, stream: bool = True,
             clock: FakeClock | None = None, lead_ms: int = 0, max_frames: int = 500) -> Request:
    """A running request past its prompt with `rows` sampled; a stream's listener has `lead_ms`
    of audio left (sent now) and its next window is due `due_in_rows` rows from now."""
    playback = None
    if stream:
        playback = PlaybackClock(1.0, clock.now - 10_000 * MS, clock.now - 10_000 * MS)
        playback.sent(1, clock.now)  # its first audio went out now ...
        playback.sent(lead_ms * SAMPLES_PER_S // 1000, clock.now)  # ... with lead_ms behind it
        playback.due_rows = rows + due_in_rows
    request = Request(request_id, tuple(range(10)), sampling=None, max_frames=max_frames, min_frames=0,
                      playback=playback)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 10 + rows - 1
    request.num_rows = rows
    return request


def waiting_stream(request_id: str, clock: FakeClock, prompt_len: int = 10, max_frames: int = 250,
                   budget_ms: int | None = 1000) -> Request:
    playback = PlaybackClock(1.0, clock.now, None, None if budget_ms is None else budget_ms * MS)
    playback.due_rows = 12  # a one-frame first chunk: 1 frame + 4 held back + the 7-row delay
    return Request(request_id, tuple(range(prompt_len)), sampling=None, max_frames=max_frames,
                   min_frames=max_frames, playback=playback)


def bulk(request_id: str, prompt_len: int = 10) -> Request:
    return Request(request_id, tuple(range(prompt_len)), sampling=None, max_frames=50, min_frames=0)


def make_scheduler(policy: SlackPolicy, max_num_seqs: int = 16, budget: int = 256) -> Scheduler:
    kv = KVCacheManager(4097, 4, enable_prefix_caching=False)
    return Scheduler(max_num_seqs, budget, 8192, kv, False, policy=policy)


def running_streams(scheduler: Scheduler, clock: FakeClock, n: int, lead_ms: int = 500,
                     due_in_rows: int = 5) -> list[Request]:
    """n streams decoding in `scheduler`, named run0.., each 20 rows into 250 frames."""
    streams = []
    for i in range(n):
        request = decoding(f"run{i}", clock=clock, lead_ms=lead_ms, rows=20, max_frames=250,
                           due_in_rows=due_in_rows)
        request.slot = scheduler._free_slots.pop()
        scheduler.kv.allocate(request, [], request.num_computed_tokens, request.max_num_tokens)
        scheduler.requests[request.request_id] = request
        scheduler.running.append(request)
        scheduler.num_running_streams += 1
        streams.append(request)
    return streams


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


# ----- which decodes run
def test_every_decode_runs_without_a_look_at_slack_while_steps_keep_up():
    clock = FakeClock()
    policy = make_policy(clock, {4: 12})  # 12 ms a step: three times real time
    decodes = [decoding(f"s{i}", clock=clock, lead_ms=-500) for i in range(3)] + [decoding("b", stream=False)]
    assert policy.choose_decodes(decodes, 4) == decodes
    assert clock.calls == 0  # the low-load path never computes a slack


def test_slack_first_when_a_step_of_every_decode_is_too_slow():
    clock = FakeClock()
    # steps of n decodes take 10·n ms: four take 40 ms, past the 36 ms real-time step (10 % headroom)
    policy = make_policy(clock, {n: 10 * n for n in range(1, 9)})
    late = decoding("late", clock=clock, lead_ms=30)
    soon = decoding("soon", clock=clock, lead_ms=200)
    ahead = decoding("ahead", clock=clock, lead_ms=3000, due_in_rows=5)
    far = decoding("far", clock=clock, lead_ms=8000, due_in_rows=5)
    file = decoding("file", stream=False)
    step = policy.model.predict_us(5, 5)
    slacks = {r.request_id: policy.slack_us(r, step) for r in (late, soon, ahead, far, file)}
    assert slacks["late"] < slacks["soon"] < 1000 * MS <= slacks["ahead"] < slacks["far"] < slacks["file"] == BULK_SLACK
    # "late" and "soon" run (less slack than park_slack_ms); a third decode would make their
    # step 30 ms, within the 36 ms real-time step; a fourth (40 ms) would eat more than "late"'s
    # share of its slack per step, so "far" and the file sit this step out
    chosen = policy.choose_decodes([file, far, ahead, soon, late], 4)
    assert ids(chosen) == ["ahead", "soon", "late"]  # in the order given (admission order)


def test_well_buffered_streams_and_bulk_run_when_nothing_is_tight():
    clock = FakeClock()
    policy = make_policy(clock, {n: 10 * n for n in range(1, 9)})
    decodes = [decoding(f"s{i}", clock=clock, lead_ms=5000) for i in range(4)] + [decoding("file", stream=False)]
    assert policy.choose_decodes(decodes, 4) == decodes  # every stream far ahead: all run


def test_a_skipped_stream_comes_back_before_its_listener_runs_dry():
    clock = FakeClock()
    policy = make_policy(clock, {n: 10 * n for n in range(1, 9)})
    tight = [decoding(f"t{i}", clock=clock, lead_ms=80) for i in range(3)]
    ahead = decoding("ahead", clock=clock, lead_ms=1300, due_in_rows=5)
    sat_out = 0
    for _ in range(100):
        if ahead not in policy.choose_decodes(tight + [ahead], 4):
            sat_out += 1
            clock.now += 40 * MS  # a step of the others passes; its lead shrinks
            continue
        break
    assert sat_out > 0
    lead_left = ahead.playback.deadline_us() - clock.now
    assert lead_left >= 1000 * MS - 40 * MS  # back once its slack fell under park_slack_ms


def test_when_the_streams_that_must_run_cannot_keep_real_time_together_a_stable_set_does():
    clock = FakeClock()
    policy = make_policy(clock, {n: 10 * n for n in range(1, 9)})  # three decodes keep real time
    behind = [decoding(f"behind{i}", clock=clock, lead_ms=-150) for i in range(2)]  # already stalled
    tight = [decoding(f"tight{i}", clock=clock, lead_ms=60) for i in range(4)]
    decodes = behind + tight  # admission order
    # least slack first would run the two that already stalled and one more; all six would fall
    # further behind together. The three oldest that still play without a gap run.
    assert ids(policy.choose_decodes(decodes, 6)) == ["tight0", "tight1", "tight2"]
    assert policy.num_decoding == 3
    assert ids(policy.choose_decodes(behind + tight[:1], 3)) == ids(behind + tight[:1])  # all keep real time


# ----- prompts
def test_prompt_chunks_fit_the_tightest_stream_and_go_least_slack_first():
    clock = FakeClock()
    policy = make_policy(clock, {1: 10, 2: 10, 3: 10}, min_prefill_chunk_tokens=8)
    policy.model.observe(2, 2 + 100, 20 * MS)  # 100 prompt tokens cost 10 ms: 100 µs each
    scheduler = make_scheduler(policy, budget=512)
    scheduler.add_request(bulk("file", prompt_len=300))
    scheduler.add_request(waiting_stream("early", clock, prompt_len=300, budget_ms=None))
    clock.now += 200 * MS
    running_streams(scheduler, clock, 1, lead_ms=100, due_in_rows=4)
    # a long-form segment whose listener runs out of the earlier segments' audio in 50 ms
    urgent = waiting_stream("urgent", clock, prompt_len=300, budget_ms=None)
    urgent.playback.first_audio_due_us = clock.now + 50 * MS
    scheduler.add_request(urgent)
    plan = scheduler.schedule()
    # the file queued first, yet the streams start first, in arrival order
    assert [c.request_id for c in plan.chunks] == ["run0", "early", "urgent", "file"]
    # run0 (its row of this step scheduled) has 100 ms of lead less a 10 ms step for each of the 3
    # rows still due: 70 ms over this step and those 3, 17.5 ms a step: 175 prompt tokens at
    # 100 µs, shared by the three prompts in flight
    assert [c.num_tokens for c in plan.chunks[1:]] == [59, 59, 57]
    scheduler.update(plan, StepResult(plan.step_id, {"run0": ROW}, ()))
    plan = scheduler.schedule()
    # now prompts in flight: the least slack first
    assert [c.request_id for c in plan.chunks] == ["run0", "urgent", "early", "file"]
    off = make_scheduler(make_policy(FakeClock(), enabled=False), budget=512)
    for request in (bulk("f2", 300), bulk("g2", 300)):
        off.add_request(request)
    assert sum(c.num_tokens for c in off.schedule().chunks) == 512  # the policy off: no cap


# ----- admission
def test_a_stream_starts_while_fewer_run_than_the_limit_and_bulk_fills_the_rest():
    clock = FakeClock()
    # 16 ms for 2 decodes, 36 ms for 3: three streams keep real time (the real-time step is 36 ms)
    policy = make_policy(clock, {2: 16, 3: 36, 4: 44})
    scheduler = make_scheduler(policy, max_num_seqs=5)
    running_streams(scheduler, clock, 2)
    assert policy.predicted_capacity(scheduler.running) == 3
    policy.limit.seed(3)  # as the start-up timings would
    for request in (waiting_stream("third", clock, budget_ms=None), waiting_stream("fourth", clock, budget_ms=None),
                    bulk("file"), bulk("file2")):
        scheduler.add_request(request)
    plan = scheduler.schedule()
    started = [n.request_id for n in plan.new_requests]
    # "fourth" waits for a place under the limit; a file takes a slot, the last stays free for "fourth"
    assert started == ["third", "file"]
    assert ids(scheduler.waiting) == ["fourth", "file2"]
    assert len(scheduler._free_slots) == 1
    assert scheduler.num_running_streams == 3  # the file does not count
    assert policy.limit_stats(scheduler.running)["stream_capacity"] == 3
    scheduler.abort("third")
    scheduler.abort("file")
    assert scheduler.num_running_streams == 2


def test_a_prediction_never_holds_a_stream_back_while_places_are_free_and_leads_hold():
    clock = FakeClock()
    # the model thinks four decodes take 80 ms, twice the real-time step; the limit (8) says otherwise
    policy = make_policy(clock, {1: 10, 4: 80})
    policy.limit.seed(8)
    scheduler = make_scheduler(policy)
    running_streams(scheduler, clock, 4)
    scheduler.add_request(waiting_stream("fifth", clock, budget_ms=None))
    assert [n.request_id for n in scheduler.schedule().new_requests] == ["fifth"]


def test_no_stream_starts_while_the_leads_fall():
    clock = FakeClock()
    policy = make_policy(clock, {1: 10, 2: 12, 3: 14})
    scheduler = make_scheduler(policy)
    running_streams(scheduler, clock, 2)
    policy.limit.seed(2)  # two run, as many as the limit allows
    policy.observe_lead(clock.now, -60 * MS, True)  # a listener 60 ms dry and losing ground (past the -50 ms margin)
    scheduler.add_request(waiting_stream("new", clock, budget_ms=None))
    assert not scheduler.schedule().new_requests  # the limit fell to one
    assert policy.limit.limit == 1 and ids(scheduler.waiting) == ["new"]
    scheduler.abort("run0")
    scheduler.abort("run1")
    assert [n.request_id for n in scheduler.schedule().new_requests] == ["new"]  # a place opened


def test_a_stream_that_would_start_past_its_budget_is_refused_with_the_wait():
    clock = FakeClock()
    policy = make_policy(clock, {1: 10, 2: 20, 3: 36, 4: 48})  # three streams fit
    policy.limit.seed(3)
    scheduler = make_scheduler(policy)
    running = running_streams(scheduler, clock, 3)
    for i, request in enumerate(running):  # 250 frames each, 20, 120 and 220 rows sampled
        request.num_rows = 20 + 100 * i
    with pytest.raises(OverCapacityError) as refused:
        scheduler.add_request(waiting_stream("new", clock, budget_ms=1000))
    # the first place opens when run2 ends: 250 + 8 - 220 = 38 rows of 36 ms = 1.37 s; then
    # 10 prompt tokens and 12 rows to its first chunk: about 1.8 s, 0.8 s past the budget
    assert refused.value.retry_after_s == 1
    assert "1.8 s" in str(refused.value)
    # one withdrawn from the queue now would be told when the first place opens: 1.37 s
    assert policy.retry_after_s(scheduler.running, scheduler.waiting) == 2
    assert "new" not in scheduler.requests
    # with room for it, or with a budget long enough, the same request waits in the queue
    patient = waiting_stream("patient", clock, budget_ms=3000)
    scheduler.add_request(patient)
    assert ids(scheduler.waiting) == ["patient"]
    # it must have its place by its budget less its prompt and first window (12 rows of 36 ms),
    # or its caller withdraws it
    assert patient.playback.withdraw_at_us == clock.now + 3000 * MS - 12 * 36 * MS - 10 * 50
    patient.playback.admitted_us = clock.now
    assert patient.playback.withdraw_at_us is None


def test_an_idle_engine_never_refuses_however_slow_it_thinks_it_is():
    clock = FakeClock()
    policy = make_policy(clock, {1: 900})  # nearly a second a step
    scheduler = make_scheduler(policy)
    scheduler.add_request(waiting_stream("only", clock, budget_ms=100))
    assert [n.request_id for n in scheduler.schedule().new_requests] == ["only"]


def test_a_stream_gets_its_first_audio_deadline_at_arrival():
    clock = FakeClock()
    scheduler = make_scheduler(make_policy(clock, first_audio_target_ms=250))
    request = waiting_stream("s", clock, budget_ms=None)
    scheduler.add_request(request)
    assert request.playback.deadline_us() == clock.now + 250 * MS


def test_off_the_policy_is_first_come_first_served():
    clock = FakeClock()
    policy = make_policy(clock, {n: 50 * n for n in range(1, 5)}, enabled=False)
    scheduler = make_scheduler(policy, max_num_seqs=4)
    running_streams(scheduler, clock, 3, lead_ms=-900)
    for request in (bulk("file"), waiting_stream("late", clock, budget_ms=1)):
        scheduler.add_request(request)  # never refused
    plan = scheduler.schedule()
    assert [c.request_id for c in plan.chunks] == ["run0", "run1", "run2", "file"]  # every decode, the head


# ----- the step-time model learns from the steps the scheduler reports
def test_update_teaches_the_step_model_the_plan_it_timed():
    clock = FakeClock()
    policy = make_policy(clock)
    scheduler = make_scheduler(policy)
    scheduler.add_request(bulk("a"))
    plan = scheduler.schedule()
    scheduler.update(plan, StepResult(plan.step_id, {"a": ROW}, ()), elapsed_us=7 * MS)
    plan = scheduler.schedule()  # a decode of one
    scheduler.update(plan, StepResult(plan.step_id, {"a": ROW}, ()), elapsed_us=3 * MS)
    assert policy.model.predict_us(1, 1) == 3 * MS
    policy.synchronous_steps = True  # the CPU: the time between collects is the next plan's
    plan = scheduler.schedule()
    nxt = scheduler.schedule()
    scheduler.update(plan, StepResult(plan.step_id, {"a": ROW}, ()), elapsed_us=5 * MS)
    assert policy.model.mean_decode_us(1) == 4 * MS  # the mean of 3 and 5 ms
    assert policy.model.predict_us(1, 1) == 6 * MS  # planned with twice their 1 ms deviation
    assert nxt is not None
