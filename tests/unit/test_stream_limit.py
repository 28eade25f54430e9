"""Issue 59: the stream limit (engine/deadlines/stream_limit.py), steered by the leads listeners
have: where it starts, when it probes upward and by how much, when it falls and to what, and what
it refuses to read as a fall. Integer µs on a hand-moved clock."""

from higgs_serve.engine.deadlines.stream_limit import CEILING_US, PROBE_US, WINDOW_US, StreamLimit

MS = 1000


def limit_at(initial: int | None = 20, slots: int = 64, margin_ms: int = 0) -> StreamLimit:
    return StreamLimit(slots, margin_ms * MS, initial)


def never(*_) -> int:
    raise AssertionError("the measured capacity was asked for")


def test_it_starts_at_the_capacity_timed_at_start_up_or_every_slot():
    assert limit_at(20).limit == 20
    assert limit_at(None).limit == 64
    assert limit_at(500).limit == 64
    seeded = limit_at(None)
    seeded.seed(12)
    assert seeded.limit == 12


def test_a_limit_that_does_not_bind_does_not_move():
    limit = limit_at(20)
    for t in range(0, 5_000, 100):
        limit.observe(t * MS, 300 * MS, False)
        # streams wait, but fewer run than the limit allows (KV or slots hold them): no probe
        assert limit.update(t * MS, running=10, waiting=5, capacity=never) == 20
    assert limit.update(6_000 * MS, running=20, waiting=0, capacity=never) == 20  # nobody waits


def test_healthy_and_binding_it_probes_by_the_square_root_or_jumps_to_the_capacity():
    limit = limit_at(16)
    limit.observe(0, 200 * MS, False)
    assert limit.update(0, running=16, waiting=8, capacity=lambda: 10) == 20  # 16 + √16
    assert limit.update(PROBE_US // 2, running=20, waiting=4, capacity=never) == 20  # one step per PROBE_US
    assert limit.update(PROBE_US, running=20, waiting=4, capacity=lambda: 48) == 48  # the timings say more fits
    assert limit.update(2 * PROBE_US, running=48, waiting=4, capacity=lambda: 48) == 54
    assert limit.update(3 * PROBE_US, running=54, waiting=4, capacity=lambda: 48) == 62  # 54.9 + 7.4
    assert limit.update(4 * PROBE_US, running=62, waiting=4, capacity=lambda: 48) == 64  # the slots
    assert limit.changes == {"fall": 0, "probe": 4, "jump": 1}  # the metrics' counts


def test_no_leads_yet_is_no_reason_to_hold_back():
    limit = limit_at(8)
    assert limit.update(0, running=8, waiting=56, capacity=lambda: 64) == 64


def test_a_listener_falling_behind_drops_the_limit_below_what_ran():
    limit = limit_at(40)
    limit.observe(10 * MS, 500 * MS, False)
    limit.observe(20 * MS, -30 * MS, True)  # one listener 30 ms dry and losing more
    assert limit.update(30 * MS, running=40, waiting=10, capacity=lambda: 64) == 36  # 0.9 x 40
    state = limit.state(30 * MS)
    assert state.ceiling == 40
    # the measured capacity is lower than 0.9 of what ran: down to it
    other = limit_at(40)
    other.observe(0, -30 * MS, True)
    assert other.update(0, running=40, waiting=0, capacity=lambda: 25) == 25
    # at least one fewer, never below one
    small = limit_at(3)
    small.observe(0, -30 * MS, True)
    assert small.update(0, running=3, waiting=0, capacity=lambda: 64) == 2
    lone = limit_at(20)
    lone.observe(0, -300 * MS, True)  # one stream alone (a cold path at start-up): no load to shed
    assert lone.update(0, running=1, waiting=0, capacity=lambda: 64) == 20


def test_after_a_fall_nothing_is_judged_until_a_window_of_new_leads_came():
    limit = limit_at(40)
    limit.observe(0, -50 * MS, True)
    assert limit.update(0, running=40, waiting=0, capacity=lambda: 64) == 36
    limit.observe(100 * MS, -80 * MS, True)
    assert limit.update(WINDOW_US - 1, running=36, waiting=0, capacity=lambda: 64) == 36
    limit.observe(WINDOW_US + 10 * MS, -80 * MS, True)
    assert limit.update(WINDOW_US + 20 * MS, running=36, waiting=0, capacity=lambda: 64) == 32


def test_listeners_behind_but_catching_up_hold_the_limit():
    limit = limit_at(30)
    for t in range(0, 3_000, 100):
        limit.observe(t * MS, -40 * MS, False)  # behind, gaining ground at every chunk
        assert limit.update(t * MS, running=30, waiting=5, capacity=never) == 30  # neither falls nor probes


def test_streams_still_over_a_limit_that_just_fell_do_not_make_it_fall_again():
    limit = limit_at(40)
    limit.observe(0, -50 * MS, True)
    assert limit.update(0, running=40, waiting=0, capacity=lambda: 64) == 36
    for t in range(WINDOW_US, 5 * WINDOW_US, PROBE_US):
        limit.observe(t, -200 * MS, True)  # the forty keep losing ground until some end
        assert limit.update(t, running=40, waiting=0, capacity=lambda: 64) == 36


def test_the_count_that_hurt_caps_the_jump_for_a_while_and_the_probe_passes_it_one_at_a_time():
    limit = limit_at(40)
    limit.observe(0, -50 * MS, True)
    assert limit.update(0, running=40, waiting=0, capacity=lambda: 64) == 36
    t = WINDOW_US
    limit.observe(t, 300 * MS, False)
    assert limit.update(t, running=36, waiting=9, capacity=lambda: 64) == 39  # up to one short of 40
    t += PROBE_US
    assert limit.update(t, running=39, waiting=9, capacity=lambda: 64) == 40  # then one ...
    assert limit.update(t + PROBE_US, running=40, waiting=9, capacity=lambda: 64) == 40
    t += WINDOW_US
    assert limit.update(t, running=40, waiting=9, capacity=lambda: 64) == 41  # ... a window at a time
    late = limit_at(40)
    late.observe(0, -50 * MS, True)
    late.update(0, running=40, waiting=0, capacity=lambda: 64)
    late.observe(CEILING_US + 1, 300 * MS, False)
    assert late.update(CEILING_US + 1, running=36, waiting=9, capacity=lambda: 64) == 64  # forgotten


def test_the_tail_is_the_first_percentile_of_the_last_second():
    limit = limit_at(20, margin_ms=-20)
    for i in range(300):
        limit.observe(i * MS, (100 + i) * MS, False)
    limit.observe(300 * MS, -500 * MS, True)  # one listener in 301 far behind
    assert limit.state(400 * MS).tail_us == 102 * MS  # index 301 // 100 of the sorted leads
    assert limit.update(400 * MS, running=20, waiting=3, capacity=lambda: 20) == 24  # healthy: probes
    for i in range(5):
        limit.observe(500 * MS, -300 * MS, True)
    assert limit.state(1_000 * MS).tail_us == -300 * MS
    assert limit.update(1_000 * MS, running=24, waiting=3, capacity=lambda: 64) == 21
    assert limit.state(2_000 * MS + 1).tail_us is None  # a window later, nothing is left of them


def test_the_recent_peak_is_the_most_streams_held_lately():
    limit = limit_at(20)
    limit.update(0, running=12, waiting=6, capacity=lambda: 20)
    limit.update(5_000 * MS, running=2, waiting=0, capacity=lambda: 20)
    assert limit.recent_peak(5_000 * MS) == 18
    assert limit.recent_peak(31_000 * MS) == 0
