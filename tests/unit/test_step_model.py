"""Issue 53: Stage 0's step-time model (engine/deadlines/step_model.py), learned from measured
steps: the prior before data, a mean then a moving average per batch size, interpolation between
measured sizes, extrapolation above them, the cost of prompt tokens, and outliers capped."""

from higgs_serve.engine.deadlines.step_model import StepPrior, StepTimeModel

MS = 1000
PRIOR = StepPrior(base_us=20 * MS, per_seq_us=1 * MS, per_token_us=50)


def model(**measured_ms) -> StepTimeModel:
    m = StepTimeModel(max_num_seqs=64, prior=PRIOR)
    for n, ms in measured_ms.items():
        m.observe(int(n[1:]), int(n[1:]), int(ms * MS))
    return m


def test_the_prior_answers_until_a_step_is_measured():
    m = model()
    assert m.predict_us(1, 1) == 21 * MS
    assert m.predict_us(10, 10 + 100) == 30 * MS + 100 * 50


def test_a_size_learns_its_mean_then_a_moving_average():
    m = model()
    for ms in (10, 12, 14):
        m.observe(4, 4, ms * MS)
    assert m.mean_decode_us(4) == 12 * MS  # the mean of the first ones
    for _ in range(200):
        m.observe(4, 4, 30 * MS)
    assert abs(m.predict_us(4, 4) - 30 * MS) < 50  # follows a lasting change; steady: no spread


def test_a_host_whose_steps_vary_is_planned_for_its_slow_steps():
    m = model()
    for _ in range(100):
        m.observe(8, 8, 10 * MS)
        m.observe(8, 8, 20 * MS)
    assert abs(m.mean_decode_us(8) - 15 * MS) < 1 * MS
    assert 23 * MS < m.predict_us(8, 8) < 27 * MS  # the mean and twice its 5 ms deviation


def test_between_measured_sizes_linear_above_them_the_top_half_slope_below_the_smallest():
    m = model(n2=10, n8=16, n16=32)
    assert m.predict_us(5, 5) == 13 * MS  # halfway from 2 to 8
    assert m.predict_us(12, 12) == 24 * MS
    # above 16: the slope from 8 (the measured size nearest half of 16) to 16: 2 ms a sequence
    assert m.predict_us(20, 20) == 40 * MS
    assert m.predict_us(1, 1) == 10 * MS  # below the smallest: the smallest's


def test_one_measured_size_extrapolates_with_the_priors_slope_and_a_flat_gpu_stays_flat():
    assert model(n4=8).predict_us(10, 10) == 14 * MS
    flat = model(n1=9, n32=9, n64=9)
    assert flat.predict_us(48, 48) == 9 * MS


def test_prompt_tokens_cost_what_mixed_steps_took_beyond_their_decodes():
    m = model(n4=10)
    m.observe(4, 4 + 200, 30 * MS)  # 200 prompt tokens took 20 ms more
    assert m.token_us == 100
    assert m.predict_us(4, 4 + 50) == 15 * MS
    assert m.tokens_within(2 * MS) == 20
    m.observe(4, 4 + 3, 100 * MS)  # too few tokens to say anything
    assert m.token_us == 100


def test_one_stall_of_the_host_moves_the_estimate_a_bounded_step():
    m = model()
    for _ in range(20):
        m.observe(2, 2, 10 * MS)
    m.observe(2, 2, 5000 * MS)  # a 5 s pause (a collection, a page fault)
    # capped at 4x the mean, weighted 0.1: 13 ms of mean and 3 ms of deviation (x2)
    assert m.predict_us(2, 2) == 19 * MS


# ----- issue 59: timed at start-up, the timings' shape at the live steps' level
def timed(**decode_ms) -> StepTimeModel:
    m = StepTimeModel(max_num_seqs=64, prior=PRIOR)
    m.seed({int(n[1:]): int(ms * MS) for n, ms in decode_ms.items()}, token_us=30)
    return m


def test_timed_sizes_answer_until_live_steps_run():
    m = timed(n1=4, n8=6, n64=20)
    assert m.seeded
    assert m.predict_us(1, 1) == 4 * MS
    assert m.predict_us(36, 36) == 13 * MS  # halfway from 8 to 64
    assert m.predict_us(64, 64 + 100) == 20 * MS + 100 * 30  # the timed token cost
    assert m.predict_us(200, 200) == 20 * MS  # never extrapolated past the largest size timed


def test_live_steps_set_the_level_of_every_size():
    m = timed(n1=4, n8=6, n64=20)
    for _ in range(50):
        m.observe(8, 8, 12 * MS)  # the loop and the host make a step of 8 twice its timing
    assert abs(m.predict_us(64, 64) - 40 * MS) < 100  # a size not yet run: twice its timing too
    assert abs(m.mean_decode_us(1) - 8 * MS) < 100


def test_live_steps_that_vary_are_planned_at_their_mean_and_a_stall_moves_it_a_bounded_step():
    m = timed(n1=4, n8=10)
    for _ in range(100):
        m.observe(8, 8, 10 * MS)
        m.observe(8, 8, 20 * MS)
    assert 14 * MS < m.predict_us(8, 8) < 16 * MS  # live ÷ timed averages 1.5
    assert 5.6 * MS < m.predict_us(1, 1) < 6.4 * MS
    before = m.predict_us(8, 8)
    m.observe(8, 8, 5_000 * MS)  # a 5 s pause of the host
    assert m.predict_us(8, 8) <= before * 1.31  # capped at 4x, weighted 0.1


def test_a_size_held_up_while_it_was_timed_takes_the_next_larger_ones_time():
    m = timed(n1=4, n8=30, n16=10, n32=12)  # 8 was timed while something else ran
    assert m.predict_us(8, 8) == 10 * MS
    assert m.predict_us(4, 4) == 4 * MS + 6 * MS * 3 // 7  # between 1 (4 ms) and 8 (10 ms)
