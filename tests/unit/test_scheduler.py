"""Scheduler: token budget, chunked prefill order, admission, reservation, abort, prefix hits."""

import pytest

from higgs_serve.engine.kv_cache_manager import KVCacheManager
from higgs_serve.worker.step_contract import StepResult
from higgs_serve.engine.request import TAIL_ROWS, Request, RequestStatus
from higgs_serve.engine.scheduler import Scheduler
from higgs_serve.errors import ConfigError, InputTooLongError, InvalidRequestError

BS = 4
ROW = (5,) * 8  # any delayed row: the scheduler only counts rows


def make_scheduler(
    num_blocks=1025, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=4096, caching=False
):
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(max_num_seqs, max_num_batched_tokens, max_model_len, kv, caching)


def make_request(request_id, prompt_len, max_frames=20, first_token=0, **kwargs):
    prompt = tuple(range(first_token, first_token + prompt_len))
    return Request(request_id, prompt, sampling=None, max_frames=max_frames, min_frames=0, **kwargs)


def run_step(scheduler, finished=()):
    """Schedule one plan and answer it like a runner: one row per sampling chunk."""
    plan = scheduler.schedule()
    assert plan is not None
    rows = {c.request_id: ROW for c in plan.chunks if c.samples}
    done = scheduler.update(plan, StepResult(plan.step_id, rows, tuple(finished)))
    return plan, done


def tokens_by_request(plan):
    return {c.request_id: c.num_tokens for c in plan.chunks}


# ----- budget and ordering
def test_token_budget_and_seq_limit_hold_every_step():
    scheduler = make_scheduler(max_num_seqs=3, max_num_batched_tokens=10)
    for i in range(6):
        scheduler.add_request(make_request(f"r{i}", 7, max_frames=3))
    steps = 0
    while scheduler.has_work:
        plan, _ = run_step(scheduler)
        assert sum(c.num_tokens for c in plan.chunks) <= 10
        assert len(plan.chunks) <= 3
        assert scheduler.num_running <= 3
        steps += 1
        assert steps < 200
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_usable_blocks


def test_decodes_first_then_prompts_share_the_rest():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=8)
    scheduler.add_request(make_request("short", 3))
    plan, _ = run_step(scheduler)
    assert tokens_by_request(plan) == {"short": 3}
    scheduler.add_request(make_request("long", 20))
    scheduler.add_request(make_request("next", 5))
    plan, _ = run_step(scheduler)
    # the decode comes first; two prompts in flight share the other 7 tokens (4 + 3), so
    # "next" does not wait for the whole of "long"
    assert [(c.request_id, c.num_tokens, c.samples) for c in plan.chunks] == [
        ("short", 1, True),
        ("long", 4, False),
        ("next", 3, False),
    ]
    plan, _ = run_step(scheduler)
    # next ends its prompt with 2 tokens and samples
    assert [(c.request_id, c.num_tokens, c.samples) for c in plan.chunks] == [
        ("short", 1, True),
        ("long", 4, False),
        ("next", 2, True),
    ]
    plan, _ = run_step(scheduler)
    # long is the only prompt left: it takes everything the two decodes leave
    assert [(c.request_id, c.num_tokens) for c in plan.chunks] == [
        ("short", 1),
        ("next", 1),
        ("long", 6),
    ]


def test_a_short_prompt_is_not_held_behind_long_prefills():
    """Prefill fairness: a short prompt arriving while long prompts prefill gets its first (and
    only) chunk in the next step; before, it waited for every long prompt ahead of it."""
    scheduler = make_scheduler(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=8192)
    for i in range(3):
        scheduler.add_request(make_request(f"long{i}", 1000, max_frames=10))
    run_step(scheduler)
    scheduler.add_request(make_request("short", 10))
    plan, _ = run_step(scheduler)
    assert tokens_by_request(plan)["short"] == 10  # its whole prompt, this step
    assert sum(c.num_tokens for c in plan.chunks) <= 64


def test_a_lone_prompt_still_takes_the_whole_budget():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    scheduler.add_request(make_request("long", 40))
    plan, _ = run_step(scheduler)
    assert tokens_by_request(plan) == {"long": 16}


def test_long_prompt_never_stalls_running_decodes():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=8192)
    for i in range(3):
        scheduler.add_request(make_request(f"d{i}", 2, max_frames=200))
    run_step(scheduler)
    scheduler.add_request(make_request("huge", 500, max_frames=10))
    for _ in range(20):
        plan, _ = run_step(scheduler)
        chunks = tokens_by_request(plan)
        assert [c.request_id for c in plan.chunks[:3]] == ["d0", "d1", "d2"]
        assert all(chunks[f"d{i}"] == 1 for i in range(3))
        assert chunks["huge"] == 5


def test_token_accounting_positions_and_samples():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    request = make_request("a", 6, max_frames=2)
    scheduler.add_request(request)
    plan, _ = run_step(scheduler)
    (chunk,) = plan.chunks
    assert (chunk.start_pos, chunk.num_tokens, chunk.samples) == (0, 4, False)
    assert plan.new_requests[0].slot == chunk.slot == 0
    plan, _ = run_step(scheduler)
    (chunk,) = plan.chunks
    assert (chunk.start_pos, chunk.num_tokens, chunk.samples) == (4, 2, True)  # row 0
    assert plan.new_requests == ()
    for t in range(1, 5):  # row t is sampled after feeding row t-1 at prompt_len + t - 1
        plan, _ = run_step(scheduler)
        (chunk,) = plan.chunks
        assert (chunk.start_pos, chunk.num_tokens, chunk.samples) == (6 + t - 1, 1, True)
        assert request.num_rows == t + 1
        assert request.num_computed_tokens == 6 + t
        assert len(chunk.block_ids) == -(-(6 + t) // BS)


# ----- admission and the reservation policy
def test_admitted_only_when_worst_case_blocks_fit_and_fcfs_blocks_the_queue():
    # 12 usable blocks; each request: prompt 4 + 18 frames + 7 = 29 tokens = 8 blocks
    scheduler = make_scheduler(num_blocks=13, max_num_seqs=4)
    scheduler.add_request(make_request("a", 4, max_frames=18))
    scheduler.add_request(make_request("b", 4, max_frames=18))
    scheduler.add_request(make_request("tiny", 1, max_frames=1))  # 9 tokens = 3 blocks, would fit
    plan, _ = run_step(scheduler)
    assert tokens_by_request(plan) == {"a": 4}
    assert scheduler.num_waiting == 2  # b does not fit, tiny waits behind it (FCFS)
    assert scheduler.kv.num_free_blocks == 4
    for _ in range(5):
        plan, _ = run_step(scheduler)
        assert [c.request_id for c in plan.chunks] == ["a"]
    plan, done = run_step(scheduler, finished=("a",))
    assert [r.request_id for r in done] == ["a"]
    assert done[0].status is RequestStatus.FINISHED_STOPPED
    plan, _ = run_step(scheduler)
    assert tokens_by_request(plan) == {"b": 4, "tiny": 1}  # 8 + 3 blocks fit in the 12 freed
    assert plan.released_slots == (0,)
    assert [n.slot for n in plan.new_requests] == [0, 1]
    assert scheduler.kv.num_free_blocks == 1


def test_decode_never_runs_out_of_blocks_when_the_pool_is_full():
    # 3 requests × (4 + 10 + 7 = 21 tokens = 6 blocks) = 18 blocks = the whole pool
    scheduler = make_scheduler(num_blocks=19, max_num_seqs=4)
    requests = [make_request(f"r{i}", 4, max_frames=10) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    scheduler.add_request(make_request("late", 1, max_frames=1))
    finished = []
    for _ in range(40):
        if not scheduler.has_work:
            break
        at_cap = [r.request_id for r in requests if r.num_rows == r.max_num_rows - 1]
        _, done = run_step(scheduler, finished=at_cap)  # the runner ends capped requests
        finished += [r.request_id for r in done]
    assert finished[:3] == ["r0", "r1", "r2"] and finished[3] == "late"
    assert all(r.num_rows == 10 + TAIL_ROWS for r in requests)
    assert all(r.num_computed_tokens == 4 + 10 + TAIL_ROWS - 1 for r in requests)
    assert scheduler.kv.num_free_blocks == 18


def test_length_safety_net_finishes_a_request_the_runner_did_not_stop():
    scheduler = make_scheduler()
    request = make_request("a", 3, max_frames=1)
    scheduler.add_request(request)
    done = []
    for _ in range(TAIL_ROWS + 1):
        _, done = run_step(scheduler)
        if done:
            break
    assert done == [request] and request.status is RequestStatus.FINISHED_LENGTH
    assert request.num_rows == request.max_num_rows
    assert scheduler.schedule() is None


def test_rejects_requests_that_can_never_fit():
    scheduler = make_scheduler(num_blocks=9, max_model_len=64)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        scheduler.add_request(make_request("long", 40, max_frames=17))  # 40 + 17 + 8 = 65
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        scheduler.add_request(make_request("big", 20, max_frames=10))  # 37 tokens = 10 blocks > 8
    make_scheduler(max_model_len=64).add_request(make_request("edge", 40, max_frames=16))  # = 64
    scheduler.add_request(make_request("ok", 4, max_frames=10))  # 21 tokens = 6 blocks
    with pytest.raises(InvalidRequestError, match="already in use"):
        scheduler.add_request(make_request("ok", 4))
    assert scheduler.num_waiting == 1


def test_a_prompt_with_no_room_to_speak_is_input_too_long_without_ids():
    """A prompt that leaves no frame of room is the input's fault (413 on `input`), and the
    client-facing message carries no internal request id."""
    scheduler = make_scheduler(max_model_len=64)
    with pytest.raises(InputTooLongError) as caught:
        scheduler.add_request(make_request("speech-0123abcd", 56, max_frames=1))  # 56 + 1 + 8 > 64
    assert caught.value.param == "input" and "speech-0123abcd" not in str(caught.value)
    assert "at most 55" in str(caught.value)
    with pytest.raises(InvalidRequestError) as caught:
        scheduler.add_request(make_request("speech-0123abcd", 40, max_frames=20))
    assert caught.value.param == "max_new_tokens" and "speech-" not in str(caught.value)


def test_rejects_budget_below_max_num_seqs_and_mismatched_caching():
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        make_scheduler(max_num_seqs=8, max_num_batched_tokens=4)
    kv = KVCacheManager(9, BS, enable_prefix_caching=False)
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        Scheduler(4, 16, 64, kv, enable_prefix_caching=True)


# ----- abort
def test_abort_waiting_request():
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add_request(make_request("a", 4))
    scheduler.add_request(make_request("b", 4))
    run_step(scheduler)
    assert scheduler.abort("b")
    assert scheduler.num_waiting == 0 and not scheduler.abort("b")
    plan, _ = run_step(scheduler)
    assert plan.released_slots == ()


def test_abort_running_frees_blocks_and_reports_the_slot_next_plan():
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add_request(make_request("a", 4))
    scheduler.add_request(make_request("b", 4))
    run_step(scheduler)
    free_before = scheduler.kv.num_free_blocks
    assert scheduler.abort("a")
    assert scheduler.kv.num_free_blocks > free_before
    scheduler.add_request(make_request("c", 4))
    plan = scheduler.schedule()
    assert plan.released_slots == (0,)
    assert [c.request_id for c in plan.chunks] == ["b", "c"]
    assert plan.new_requests[0].slot == 0  # the runner frees released slots before adding
    scheduler.update(plan, StepResult(plan.step_id, {c.request_id: ROW for c in plan.chunks}, ()))
    assert scheduler.schedule().released_slots == ()


def test_abort_while_a_plan_is_in_flight_ignores_its_result():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4))
    scheduler.add_request(make_request("b", 4))
    plan = scheduler.schedule()
    scheduler.abort("a")
    done = scheduler.update(plan, StepResult(plan.step_id, {"a": ROW, "b": ROW}, ("a",)))
    assert done == []
    assert scheduler.num_running == 1
    assert [c.request_id for c in scheduler.schedule().chunks] == ["b"]


# ----- pipelining and result checks
def test_schedule_ahead_of_update_feeds_each_row_once():
    scheduler = make_scheduler()
    request = make_request("a", 5, max_frames=3)
    scheduler.add_request(request)
    first = scheduler.schedule()  # prompt, samples row 0
    second = scheduler.schedule()  # scheduled before the row arrives: feeds row 0
    assert (second.chunks[0].start_pos, second.chunks[0].num_tokens) == (5, 1)
    scheduler.update(first, StepResult(first.step_id, {"a": ROW}, ()))
    third = scheduler.schedule()
    scheduler.update(second, StepResult(second.step_id, {"a": ROW}, ()))
    assert third.chunks[0].start_pos == 6
    assert request.num_rows == 2 and request.num_pending_rows == 1


def test_update_rejects_mismatched_or_incomplete_results():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4))
    plan = scheduler.schedule()
    with pytest.raises(RuntimeError, match="does not answer"):
        scheduler.update(plan, StepResult(plan.step_id + 1, {"a": ROW}, ()))
    with pytest.raises(RuntimeError, match="no row for request a"):
        scheduler.update(plan, StepResult(plan.step_id, {}, ()))


def test_idle_scheduler_returns_none():
    scheduler = make_scheduler()
    assert scheduler.schedule() is None and not scheduler.has_work


# ----- prefix caching through the scheduler
def test_second_identical_prompt_starts_after_the_cached_blocks():
    scheduler = make_scheduler(caching=True)
    scheduler.add_request(make_request("a", 10))
    run_step(scheduler)
    scheduler.add_request(make_request("b", 10))
    plan, _ = run_step(scheduler)
    chunk_a, chunk_b = plan.chunks
    assert (chunk_b.start_pos, chunk_b.num_tokens, chunk_b.samples) == (8, 2, True)
    assert chunk_b.block_ids[:2] == chunk_a.block_ids[:2]
    kv = scheduler.kv
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (20, 8)


def test_same_step_identical_prompts_do_not_hit_uncomputed_blocks():
    scheduler = make_scheduler(caching=True)
    scheduler.add_request(make_request("a", 10))
    scheduler.add_request(make_request("b", 10))
    plan, _ = run_step(scheduler)
    # two prompts share the budget (8 each); b's blocks are not cached yet: no hit
    assert [(c.start_pos, c.num_tokens) for c in plan.chunks] == [(0, 8), (0, 8)]
    assert scheduler.kv.prefix_cache_hits == 0


def test_voice_prompts_share_only_matching_reference_blocks():
    scheduler = make_scheduler(caching=True)
    span = dict(placeholder_start=2, num_placeholders=8)
    scheduler.add_request(make_request("a", 14, placeholder_key="voice-a", **span))
    run_step(scheduler)
    scheduler.add_request(make_request("b", 14, placeholder_key="voice-b", **span))
    scheduler.add_request(make_request("c", 14, placeholder_key="voice-a", **span))
    plan, _ = run_step(scheduler)
    starts = {c.request_id: c.start_pos for c in plan.chunks}
    assert starts == {"a": 14, "b": 0, "c": 12}


def test_finished_prompt_blocks_are_evicted_under_pressure_and_never_stale():
    # 12 usable blocks; "a" = 9 + 1 + 7 = 17 tokens = 5 blocks, two of them keyed prompt blocks
    scheduler = make_scheduler(num_blocks=13, caching=True)
    scheduler.add_request(make_request("a", 9, max_frames=1))
    run_step(scheduler, finished=("a",))
    kv = scheduler.kv
    assert kv.num_free_blocks == 12
    scheduler.add_request(make_request("hog", 40, max_frames=1, first_token=1000))  # 12 blocks
    for _ in range(3):  # the prompt: 10 blocks, all plain (cached blocks are kept while possible)
        run_step(scheduler)
    assert kv.num_evictions == 0
    for _ in range(6):  # decode grows into the reserved blocks: now the cached ones go
        run_step(scheduler)
    assert kv.num_evictions == 2
    scheduler.abort("hog")
    scheduler.add_request(make_request("b", 9, max_frames=1))
    plan, _ = run_step(scheduler)
    assert (plan.chunks[0].start_pos, plan.chunks[0].num_tokens) == (0, 9)  # no stale hit
    assert kv.prefix_cache_hits == 0


def test_request_validation_names_the_field():
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        make_request("a", 0)
    with pytest.raises(InvalidRequestError, match="max_frames"):
        make_request("a", 4, max_frames=0)
    with pytest.raises(InvalidRequestError, match="placeholder span"):
        make_request("a", 4, placeholder_key="v", placeholder_start=2, num_placeholders=3)
    with pytest.raises(InvalidRequestError, match="placeholder_rows"):
        make_request("a", 4, placeholder_start=1, num_placeholders=2, placeholder_rows=((0,) * 8,))
    request = make_request("a", 5, max_frames=10)
    assert request.max_num_rows == 10 + TAIL_ROWS
    assert request.max_num_tokens == 5 + 10 + TAIL_ROWS - 1
