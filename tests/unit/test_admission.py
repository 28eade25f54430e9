"""Issues 53, 59: real-time capacity (engine/deadlines/admission.py): when n streams fit Stage 0
and Stage 1 in real time (the measured capacity the stream limit starts from and jumps to), and
how long a new stream waits for its place."""

from higgs_serve.engine.deadlines.admission import AdmissionRule, predicted_wait_us

MS = 1000
RULE = AdmissionRule(frame_us=40 * MS, headroom_ppm=100_000)  # 10 % of real time kept spare


def test_stage0_fits_while_a_step_leaves_the_headroom_of_a_frame_period():
    assert RULE.step_target_us() == 36 * MS
    assert RULE.step_target_us(max_speed=2.0) == 18 * MS  # a listener at 2x needs a row every 20 ms
    assert RULE.fits(8, 36 * MS, 0)
    assert not RULE.fits(8, 36 * MS + 1, 0)
    assert RULE.fits(1, 10_000 * MS, 10**6)  # one stream always runs (the model learns from it)


def test_stage1_fits_while_its_busiest_thread_has_time_for_every_stream():
    # 0.1 s of a codec thread per second of audio: nine streams use 0.9 of it, ten would not fit
    assert RULE.fits(9, 10 * MS, 100_000)
    assert not RULE.fits(10, 10 * MS, 100_000)
    assert not RULE.fits(5, 10 * MS, 100_000, max_speed=2.0)


def test_capacity_is_the_most_streams_that_fit():
    def free(n):
        return 0

    assert RULE.capacity(lambda n: (10 + 2 * n) * MS, free, limit=64) == 13  # 10 + 26 = 36 ms
    assert RULE.capacity(lambda n: 9 * MS, free, limit=64) == 64  # a flat step: max_num_seqs
    assert RULE.capacity(lambda n: 9 * MS, lambda n: 200_000, limit=64) == 4
    assert RULE.capacity(lambda n: 500 * MS, free, limit=64) == 1
    # Stage 1 grows cheaper per stream as its calls grow: 20 % of a thread per stream alone,
    # 2 % from batches of 8 on; 45 streams use 0.9 of it
    assert RULE.capacity(lambda n: 9 * MS, lambda n: 200_000 if n < 8 else 20_000, limit=64) == 45


def test_a_free_place_means_no_wait():
    assert predicted_wait_us([5 * MS, 9 * MS], [], free=1) == 0
    assert predicted_wait_us([5 * MS], [100 * MS], free=2) == 0  # one ahead takes one place


def test_the_wait_is_the_next_place_to_open_after_those_queued_ahead():
    ends = [3000 * MS, 1000 * MS, 2000 * MS]
    assert predicted_wait_us(ends, [], free=0) == 1000 * MS
    assert predicted_wait_us(ends, [5000 * MS], free=0) == 2000 * MS
    # two ahead: the first takes the place opening at 1 s, the second the one at 2 s; the one at
    # 3 s is next
    assert predicted_wait_us(ends, [5000 * MS, 5000 * MS], free=0) == 3000 * MS
    # more ahead than places: the places opening at 1 and 2 s are taken twice each (0.5 s
    # requests), so the next is at 2.5 s
    assert predicted_wait_us(ends, [500 * MS] * 4, free=0) == 2500 * MS


def test_streams_running_over_the_capacity_end_before_a_place_opens():
    # capacity 2, three running (the capacity fell): the earliest end frees an over-capacity place
    assert predicted_wait_us([1000 * MS, 2000 * MS, 3000 * MS], [], free=-1) == 2000 * MS
