"""Issue 53: Stage 1's load as the deadline policy reads it (engine/deadlines/stage1_load.py):
each thread's busy time per audio second from its running totals, refreshed at most once a
second, and a window's latency and jitter."""

from higgs_serve.engine.deadlines.stage1_load import Stage1Load


class Totals:
    def __init__(self):
        self.busy_s, self.audio_s = 0.0, 0.0

    def __call__(self):
        return self.busy_s, self.audio_s


def test_cost_is_busy_time_per_audio_second_refreshed_once_a_second():
    now = [100.0]
    codec, mark = Totals(), Totals()
    load = Stage1Load([codec, mark], clock=lambda: now[0])
    assert load.cost_ppm() == 0  # nothing measured: no limit from Stage 1 yet
    codec.busy_s, codec.audio_s = 0.5, 10.0  # 50 ms a second of audio
    mark.busy_s, mark.audio_s = 0.2, 10.0
    assert load.cost_ppm() == 0  # not a second yet
    now[0] += 1.0
    assert load.cost_ppm() == 50_000  # the busiest thread
    assert load.us_per_frame(40_000) == 2_800  # a window passes both: 70 ms per audio second
    codec.busy_s, codec.audio_s = 0.5 + 0.01, 10.0 + 0.1  # too little audio to say anything
    now[0] += 1.0
    assert load.cost_ppm() == 50_000
    codec.busy_s, codec.audio_s = 1.5, 20.0  # 100 ms a second since the last refresh
    now[0] += 1.0
    assert load.cost_ppm() == 60_000  # a moving average: 0.05 + 0.2 * (0.1 - 0.05)


def test_latency_and_its_jitter():
    load = Stage1Load(())
    for latency in (10_000, 10_000, 10_000):
        load.window_done(latency)
    steady = load.jitter_us
    for latency in (2_000, 30_000) * 20:
        load.window_done(latency)
    assert load.jitter_us > 4 * max(steady, 1_000)
    assert 5_000 < load.latency_us < 25_000


def test_the_capacity_reads_the_cost_timed_at_the_batch_n_streams_make():
    load = Stage1Load(())
    # the codec: 8 % of its thread per audio second in calls of one window, 1 % in calls of 16;
    # the mark: 3 % then 2 %
    load.seed([{1: 80_000, 4: 30_000, 16: 10_000}, {1: 30_000, 16: 20_000}])
    assert load.cost_ppm_at(1) == 80_000
    assert load.cost_ppm_at(3) == 80_000  # the largest batch timed not above n: never extrapolated
    assert load.cost_ppm_at(8) == 30_000
    assert load.cost_ppm_at(200) == 20_000  # the mark is the busier thread past 16
    assert Stage1Load(()).cost_ppm_at(50) == 0  # nothing timed, nothing measured
