"""The streaming window rule (docs/model.md#streaming-windows)."""

import random
from types import SimpleNamespace

import pytest

from higgs_serve.codec.chunker import (SAMPLES_PER_FRAME, StreamChunker, Window, WindowParams, first_chunk_shapes,
                                      ramp_first_chunks, ramp_initial_frames, streaming_window_shapes,
                                      warm_window_shapes)


def run_pushes(chunker: StreamChunker, counts: list[int]) -> list[tuple[int, Window]]:
    """Push D = counts[i] (finishing on the last) and collect (D, window) for every emission."""
    out = []
    for i, d in enumerate(counts):
        window = chunker.push(d, finished=i == len(counts) - 1)
        if window is not None:
            out.append((d, window))
    return out


def assert_covers_exactly(windows: list[Window], total: int) -> None:
    """New frames of consecutive windows tile [0, total) with no gap and no overlap."""
    cursor = 0
    for w in windows:
        assert w.new_start_frame == cursor
        assert w.end_frame - w.trim_back_frames == cursor + w.new_frames
        assert w.num_frames == w.trim_front_frames + w.new_frames + w.trim_back_frames
        assert 0 <= w.start_frame <= w.end_frame <= total
        cursor += w.new_frames
    assert cursor == total
    assert windows[-1].is_final and all(not w.is_final for w in windows[:-1])


def test_plain_rule_timeline_matches_reference_deployment():
    # The window rule (docs/model.md#streaming-windows) without chunk doubling. One push per
    # talker step: D = 0, 1, 2, ... de-delayed frames; finish at D = 100.
    chunker = StreamChunker(WindowParams(25, 25, 4, 1, chunk_doubling=False))
    emitted = run_pushes(chunker, list(range(0, 101)))
    d_at = [d for d, _ in emitted]
    windows = [w for _, w in emitted]
    # First chunk at D = 5 (n_rows = 12): target 1 ≥ I = 1; decode [0, 5), keep frame 0.
    assert d_at[0] == 5
    assert windows[0] == Window(0, 5, 0, 4, 1, False)
    # Second at D = 30 (n_rows = 37): target 26, 25 new; decode [0, 30), trim left 1, right 4.
    assert d_at[1] == 30
    assert windows[1] == Window(0, 30, 1, 4, 25, False)
    # Steady state every 25 frames: a 54-frame window (25 + 25 + 4), 25 new frames.
    assert d_at[2] == 55
    assert windows[2] == Window(1, 55, 25, 4, 25, False)
    assert d_at[3] == 80
    assert windows[3] == Window(26, 80, 25, 4, 25, False)
    # Final flush at D = 100: H_eff = 0, everything left.
    assert windows[4] == Window(51, 100, 25, 0, 24, True)
    assert_covers_exactly(windows, 100)
    assert windows[1].trim_front_samples == SAMPLES_PER_FRAME
    assert windows[1].trim_back_samples == 4 * SAMPLES_PER_FRAME


@pytest.mark.parametrize("seed", range(20))
def test_random_pushes_cover_every_frame_once(seed):
    rng = random.Random(seed)
    params = WindowParams(
        chunk_frames=rng.randint(1, 30),
        left_context_frames=rng.randint(0, 30),
        right_holdback_frames=rng.randint(0, 6),
        initial_chunk_frames=rng.randint(0, 35),
        chunk_doubling=rng.random() < 0.5,
    )
    counts, d = [], 0
    for _ in range(rng.randint(1, 60)):
        d += rng.choice([0, 0, 1, 1, 1, 2, 5, 17])
        counts.append(d)
    windows = [w for _, w in run_pushes(StreamChunker(params), counts)]
    assert_covers_exactly(windows, counts[-1])
    for w in windows:
        assert w.trim_front_frames <= params.left_context_frames
        assert w.trim_back_frames == (0 if w.is_final else params.right_holdback_frames)
        if not w.is_final:
            assert w.new_frames >= 1


def test_final_flush_with_nothing_new_is_an_empty_final_window():
    chunker = StreamChunker(WindowParams(2, 3, 0, 0))
    assert chunker.push(4, finished=False) == Window(0, 4, 0, 0, 4, False)
    assert chunker.push(4, finished=True) == Window(4, 4, 0, 0, 0, True)
    with pytest.raises(RuntimeError, match="after the final window"):
        chunker.push(4, finished=True)


def test_final_flush_of_a_zero_frame_request():
    assert StreamChunker().push(0, finished=True) == Window(0, 0, 0, 0, 0, True)


@pytest.mark.parametrize("doubling", [False, True])
@pytest.mark.parametrize("initial", [0, 25, 40])
def test_initial_chunk_off_when_zero_or_not_below_chunk(initial, doubling):
    chunker = StreamChunker(WindowParams(25, 25, 4, initial, doubling))
    emitted = run_pushes(chunker, list(range(0, 60)))
    assert emitted[0] == (29, Window(0, 29, 0, 4, 25, False))
    assert emitted[1] == (54, Window(0, 54, 25, 4, 25, False))  # nothing to double: C from the start


def test_initial_chunk_smaller_than_chunk_is_used_once():
    chunker = StreamChunker(WindowParams(10, 25, 4, 3, chunk_doubling=False))
    emitted = run_pushes(chunker, list(range(0, 30)))
    assert [d for d, _ in emitted[:3]] == [7, 17, 27]
    assert emitted[0][1] == Window(0, 7, 0, 4, 3, False)
    assert emitted[1][1] == Window(0, 17, 3, 4, 10, False)


def test_no_left_context_and_no_holdback():
    chunker = StreamChunker(WindowParams(5, 0, 0, 0))
    windows = [w for _, w in run_pushes(chunker, [3, 5, 9, 12, 13])]
    assert windows == [
        Window(0, 5, 0, 0, 5, False),
        Window(5, 12, 0, 0, 7, False),
        Window(12, 13, 0, 0, 1, True),
    ]


def test_chunk_doubling_timeline():
    # Shipped profiles: I = 1, then each chunk as long as everything sent before it, up to C.
    chunker = StreamChunker(WindowParams(25, 10, 4, 1, chunk_doubling=True))
    emitted = run_pushes(chunker, list(range(0, 101)))
    assert [w.new_frames for _, w in emitted] == [1, 1, 2, 4, 8, 16, 25, 25, 18]
    # the chunk after `e` frames were sent is cut once e more exist (+ the holdback): D = 2e + H
    assert [d for d, _ in emitted][:7] == [5, 6, 8, 12, 20, 36, 61]
    assert emitted[3][1] == Window(0, 12, 4, 4, 4, False)  # left context = all 4 frames sent so far
    assert emitted[5][1] == Window(6, 36, 10, 4, 16, False)  # left context capped at L = 10
    assert emitted[6][1] == Window(22, 61, 10, 4, 25, False)  # steady state
    assert_covers_exactly([w for _, w in emitted], 100)


def test_chunk_doubling_keeps_a_real_time_player_fed():
    """A player that starts at the first audio and plays at 1x never runs dry while each talker
    step (one frame of 40 ms) takes at most 20 ms; the plain rule runs dry after its first chunk
    unless steps are C / I times faster than real time."""
    def stalls(params: WindowParams, step_s: float) -> float:
        chunker, frame_s = StreamChunker(params), 0.04
        play_end, stalled = None, 0.0  # when the audio received so far runs out
        for d in range(1, 300):
            window = chunker.push(d, finished=False)
            if window is None:
                continue
            now = d * step_s
            if play_end is not None and now > play_end:
                stalled += now - play_end
            play_end = max(play_end or now, now) + window.new_frames * frame_s
        return stalled

    for left in (10, 25):
        for step_s in (0.001, 0.003, 0.01, 0.02):
            assert stalls(WindowParams(25, left, 4, 1, chunk_doubling=True), step_s) == 0.0
        assert stalls(WindowParams(25, left, 4, 1, chunk_doubling=False), 0.003) > 0.02
    assert stalls(WindowParams(25, 10, 4, 1, chunk_doubling=True), 0.03) > 0.0  # the documented limit


def test_jump_emits_all_pending_frames_at_once():
    chunker = StreamChunker(WindowParams(25, 25, 4, 1))
    assert chunker.push(100, finished=False) == Window(0, 100, 0, 4, 96, False)


def test_non_streaming_emits_one_window_at_the_end():
    chunker = StreamChunker(WindowParams(), streaming=False)
    assert all(chunker.push(d, finished=False) is None for d in range(0, 80))
    assert chunker.push(80, finished=True) == Window(0, 80, 0, 0, 80, True)


def test_frames_going_backwards_is_an_error():
    chunker = StreamChunker()
    chunker.push(10, finished=False)
    with pytest.raises(ValueError, match="went backwards"):
        chunker.push(9, finished=False)


def test_params_validation_and_from_config():
    with pytest.raises(ValueError, match="right_holdback_frames"):
        WindowParams(right_holdback_frames=-1)
    with pytest.raises(ValueError, match="chunk_frames"):
        WindowParams(chunk_frames=0)
    config = SimpleNamespace(
        codec_chunk_frames=20,
        codec_left_context_frames=10,
        codec_right_holdback_frames=3,
        initial_codec_chunk_frames=2,
        codec_chunk_doubling=False,
    )
    assert WindowParams.from_config(config) == WindowParams(20, 10, 3, 2, False)
    with pytest.raises(TypeError, match="chunk_doubling"):
        WindowParams(chunk_doubling=1)


def test_streaming_window_shapes_are_the_first_chunk_ramp_and_steady_state():
    from higgs_serve.codec.chunker import WindowShape, streaming_window_shapes

    # the plain window rule (docs/model.md#chunk-doubling): first window I + H, then
    # min(L, I) + C + H, then L + C + H; each
    # keeps its new frames (after its left context, before its holdback)
    plain = WindowParams(chunk_doubling=False)
    assert streaming_window_shapes(plain) == (WindowShape(5, 0, 1), WindowShape(30, 1, 26),
                                              WindowShape(54, 25, 50))
    assert streaming_window_shapes(WindowParams(initial_chunk_frames=0)) == (WindowShape(29, 0, 25),
                                                                             WindowShape(54, 25, 50))
    assert streaming_window_shapes(WindowParams(left_context_frames=0, right_holdback_frames=0,
                                                chunk_doubling=False)) == (WindowShape(1, 0, 1), WindowShape(25, 0, 25))
    assert streaming_window_shapes(WindowParams(left_context_frames=10, chunk_doubling=False)) == (
        WindowShape(5, 0, 1), WindowShape(30, 1, 26), WindowShape(39, 10, 35))
    # chunk doubling (the shipped profiles): chunks of 1, 1, 2, 4, 8, 16 frames, then C
    assert streaming_window_shapes(WindowParams(left_context_frames=10)) == (
        WindowShape(5, 0, 1), WindowShape(6, 1, 2), WindowShape(8, 2, 4), WindowShape(12, 4, 8),
        WindowShape(20, 8, 16), WindowShape(30, 10, 26), WindowShape(39, 10, 35))
    assert streaming_window_shapes(WindowParams()) == (
        WindowShape(5, 0, 1), WindowShape(6, 1, 2), WindowShape(8, 2, 4), WindowShape(12, 4, 8),
        WindowShape(20, 8, 16), WindowShape(36, 16, 32), WindowShape(54, 25, 50))


def test_final_windows_of_long_enough_streams_are_widened_to_one_shape():
    from higgs_serve.codec.chunker import WindowShape, final_window_shape, warm_window_shapes, widen_final

    params = WindowParams(left_context_frames=10)  # L + C + H = 39
    assert final_window_shape(params) == WindowShape(39, 10, 39)
    for total in (39, 40, 57, 250, 251):
        chunker = StreamChunker(params)
        windows = [w for _, w in run_pushes(chunker, list(range(total + 1)))]
        final = windows[-1]
        wide = widen_final(final, params)
        assert wide.shape == WindowShape(39, 10, 39)
        assert (wide.end_frame, wide.new_frames, wide.new_start_frame) == (total, final.new_frames, final.new_start_frame)
        assert_covers_exactly([*windows[:-1], wide], total)
        assert all(widen_final(w, params) is w for w in windows[:-1])  # only the final one
    short = [w for _, w in run_pushes(StreamChunker(params), list(range(39)))][-1]  # 38 frames: too short
    assert widen_final(short, params) is short
    empty = StreamChunker(params).push(0, finished=True)
    assert widen_final(empty, params) is empty
    whole = StreamChunker(params, streaming=False).push(45, finished=True)  # not streamed: all 45 frames new
    assert widen_final(whole, params) is whole
    assert warm_window_shapes(params) == (
        WindowShape(5, 0, 1), WindowShape(6, 1, 2), WindowShape(8, 2, 4), WindowShape(12, 4, 8),
        WindowShape(20, 8, 16), WindowShape(30, 10, 26), WindowShape(39, 10, 35), WindowShape(39, 10, 39))


def test_a_file_is_cut_into_exact_chunks_of_a_few_warm_shapes():
    """chunker.file_window_params: context of the whole receptive field on both sides; every
    window of a clip of at least L + C + H frames has one of three shapes."""
    from higgs_serve.codec.chunker import WindowShape, file_window_params, warm_window_shapes, widen_final

    params = file_window_params(WindowParams(left_context_frames=25), field=(10, 10))
    assert (params.chunk_frames, params.left_context_frames, params.right_holdback_frames) == (25, 10, 10)
    warm = warm_window_shapes(params)
    assert warm == (WindowShape(35, 0, 25), WindowShape(45, 10, 35), WindowShape(45, 10, 45))
    for total in (45, 46, 60, 250, 251, 1000):
        windows = [widen_final(w, params) for _, w in run_pushes(StreamChunker(params), list(range(total + 1)))]
        assert_covers_exactly(windows, total)
        assert {w.shape for w in windows} <= set(warm), total
        for w in windows:  # the receptive field on both sides of the kept frames, or the clip's edge
            first, end = w.start_frame + w.trim_front_frames, w.end_frame - w.trim_back_frames
            assert first - w.start_frame >= min(10, first) and w.end_frame - end >= min(10, total - end)


def _player_stalls_s(params: WindowParams, step_s: float, stage1_s_per_frame: float = 0.0,
                     jitter_s: float = 0.0) -> float:
    """Seconds a 1x player that starts at the first audio waits, when the talker gains a frame
    every `step_s`, a window reaches it `stage1_s_per_frame` later per frame it carries, and
    every window after the first `jitter_s` later still."""
    chunker, frame_s = StreamChunker(params), 0.04
    play_end, stalled = None, 0.0
    for d in range(1, 400):
        window = chunker.push(d, finished=False)
        if window is None:
            continue
        now = d * step_s + window.new_frames * stage1_s_per_frame + (jitter_s if play_end is not None else 0.0)
        if play_end is not None and now > play_end:
            stalled += now - play_end
        play_end = max(play_end or now, now) + window.new_frames * frame_s
    return stalled


def test_the_first_chunk_grows_until_the_doubling_ramp_keeps_ahead_of_the_player():
    params = WindowParams(25, 25, 4, 1, chunk_doubling=True)
    # steps of at most half a frame period and a steady Stage 1: the profile's one frame
    assert ramp_initial_frames(params, 8_000, 40_000) == 1
    assert ramp_initial_frames(params, 20_000, 40_000) == 1
    assert ramp_initial_frames(params, 12_000, 40_000, stage1_us_per_frame=8_000) == 1  # 12 + 4 <= 20
    # slower steps, a Stage 1 that takes longer per frame or varies: larger first chunks, the
    # more the slower (TTFA bought with continuity); each the smallest that keeps up
    # (the choices are the profile's ramp's totals, so a stream continues on the profile's ramp
    # and its windows keep the profile's warmed-up shapes)
    assert ramp_first_chunks(params) == (1, 2, 4, 8, 16, 25)
    cases = {(8_000, 0, 35_000): 2, (16_000, 0, 30_000): 2, (25_000, 0, 0): 8, (30_000, 0, 20_000): 16,
             (35_000, 0, 0): 25, (16_000, 12_000, 0): 4, (20_000, 4_000, 10_000): 4}
    for (step_us, per_frame_us, jitter_us), expected in cases.items():
        first = ramp_initial_frames(params, step_us, 40_000, per_frame_us, jitter_us)
        assert first == expected, (step_us, per_frame_us, jitter_us)
        args = (step_us / 1e6, per_frame_us / 1e6, jitter_us / 1e6)
        assert _player_stalls_s(WindowParams(25, 25, 4, first, chunk_doubling=True), *args) == 0.0
        smaller = ramp_first_chunks(params)[ramp_first_chunks(params).index(first) - 1]
        assert _player_stalls_s(WindowParams(25, 25, 4, smaller, chunk_doubling=True), *args) > 0.0
    assert ramp_initial_frames(params, 40_000, 40_000) == 25  # no ramp keeps up: the steady chunk
    assert ramp_initial_frames(WindowParams(25, 25, 4, 3), 8_000, 40_000) == 3  # never below the profile's


def test_a_stream_that_starts_bigger_continues_on_the_profiles_ramp_with_one_new_shape():
    params = WindowParams(25, 25, 4, 1, chunk_doubling=True)
    profile_shapes = set(warm_window_shapes(params))
    for first in ramp_first_chunks(params):
        grown = WindowParams(25, 25, 4, first, chunk_doubling=True)
        new = set(streaming_window_shapes(grown)) - profile_shapes
        assert new <= set(first_chunk_shapes(params)), first
