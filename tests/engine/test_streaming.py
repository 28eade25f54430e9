"""Issue 3: streamed audio equals the one-shot decode; chunks follow the window rule of docs/model.md#streaming-windows.

The tiny checkpoint's codec has random weights, so its decoder's receptive field is what it is:
we measure it by perturbing one frame. The default window (L = 25, H = 4) holds back fewer
frames than the right receptive field, so its seams carry a real error; the tests check that
the error is confined to the frames just before each seam. A window whose left context and right
holdback both cover the receptive field (L = 40, H = 16) reproduces the one-shot decode to float
rounding, and the smallest such H equals the measured right receptive field.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_harness import SAMPLES_PER_FRAME, ManualEngine, engine_deploy, sampling, speech

from higgs_serve.codec.chunker import StreamChunker, WindowParams, final_window_shape, widen_final
from higgs_serve.codec.decoder import receptive_field_frames
from higgs_serve.engine.speech import SpeechRequest

TOLERANCE = 1e-4  # max abs error relative to the one-shot decode's peak
NUM_FRAMES = 60
TEXT = "The cat sat on the mat."


def _decode(loaded, frames: np.ndarray) -> np.ndarray:
    """frames [T, 8] -> audio [T * 960] float32 (one-shot, stateless)."""
    with torch.inference_mode():
        return loaded.codec(torch.from_numpy(frames)[None]).float()[0].numpy()


def expected_chunk_sizes(num_frames: int, chunk: int, holdback: int, initial: int, doubling: bool = True) -> list[int]:
    """The window rule (docs/model.md#streaming-windows; chunk doubling unless told otherwise) for
    a request whose de-delayed frame count D grows 1, 2, ..., num_frames."""
    sizes, emitted = [], 0
    for available in range(1, num_frames + 1):
        target = available - holdback
        if emitted == 0:
            threshold = initial if 0 < initial < chunk else chunk
        else:
            threshold = min(chunk, emitted) if doubling else chunk
        if target - emitted >= threshold:
            sizes.append(target - emitted)
            emitted = target
    sizes.append(num_frames - emitted)  # the final chunk always flushes (H = 0 once finished)
    return sizes


@pytest.fixture(scope="module")
def receptive_field(tiny_loaded) -> tuple[int, int]:
    """(left, right) receptive field of the codec decoder in frames, measured by perturbing one
    frame of a random 60-frame sequence and finding which output frames move by > TOLERANCE."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 1024, size=(60, 8))
    base = _decode(tiny_loaded, frames)
    probe = 30
    moved = frames.copy()
    moved[probe] = (moved[probe] + 512) % 1024
    diff = np.abs(_decode(tiny_loaded, moved) - base).reshape(60, SAMPLES_PER_FRAME).max(axis=1)
    touched = np.nonzero(diff > TOLERANCE * np.abs(base).max())[0]
    # frames before the probe see it through the decoder's right context, and vice versa
    return int(touched.max() - probe), int(probe - touched.min())


class WindowRecorder:
    """Wraps the codec runner's submit to log each window with the row count at submission."""

    def __init__(self, engine: ManualEngine):
        self.engine = engine
        self.windows = []  # (rows sampled when submitted, frames decoded, front trim, back trim, final)
        self._submit = engine.core.codec.submit
        engine.core.codec.submit = self._record

    def _record(self, job):
        # single-request runs: step k samples row k, and windows are submitted before the step
        # counter moves, so rows sampled = steps + 1
        rows = self.engine.core.counters.steps + 1
        self.windows.append((rows, len(job.frames), job.trim_front_frames, job.trim_back_frames, job.is_final))
        self._submit(job)

    def close(self):
        self.engine.core.codec.submit = self._submit


@pytest.fixture(scope="module")
def wide_engine(tiny_loaded):
    window = {"codec_left_context_frames": 40, "codec_right_holdback_frames": 16}
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, window=window))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def plain_rule_engine(tiny_loaded):
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, window={"codec_chunk_doubling": False}))
    yield eng
    eng.close()


def _run_recorded(engine, request):
    recorder = WindowRecorder(engine)
    try:
        (res,) = engine.generate([request])
    finally:
        recorder.close()
    return res, recorder.windows


def _seams(res) -> list[int]:
    """Frame index where each non-final chunk ends."""
    return list(np.cumsum([c.num_frames for c in res.chunks])[:-1])


def test_default_chunk_schedule(default_engine):
    params = default_engine.core.outputs.window
    assert (params.chunk_frames, params.left_context_frames, params.right_holdback_frames,
            params.initial_chunk_frames, params.chunk_doubling) == (25, 25, 4, 1, True)  # the shipped profile
    res, windows = _run_recorded(default_engine, speech("s", TEXT, sampling(0.8, 5, NUM_FRAMES), stream=True))
    sizes = [c.num_frames for c in res.chunks]
    assert sizes == expected_chunk_sizes(NUM_FRAMES, 25, 4, 1) == [1, 1, 2, 4, 8, 16, 28]
    assert [len(c.audio) for c in res.chunks] == [n * SAMPLES_PER_FRAME for n in sizes]
    assert [c.is_final for c in res.chunks] == [False] * 6 + [True]
    assert res.chunks[-1].finish_reason == "length" and all(c.finish_reason is None for c in res.chunks[:-1])
    # the first chunk leaves as soon as I = 1 frame is past the holdback: D = I + H frames,
    # i.e. 7 + I + H rows (codebook 7 lags 7 rows)
    assert windows[0] == (7 + 1 + 4, 1 + 4, 0, 4, False)
    # then once D - H reaches twice what was sent; the window re-decodes min(L, sent) frames
    assert windows[1] == (7 + 2 + 4, 1 + 1 + 4, 1, 4, False)
    assert windows[3] == (7 + 8 + 4, 4 + 4 + 4, 4, 4, False)
    assert windows[5] == (7 + 32 + 4, 16 + 16 + 4, 16, 4, False)
    # the final flush (H = 0) of 28 frames, widened to L + C + H = 54 frames (chunker.widen_final):
    # every long enough request's final window has one shape
    assert windows[6] == (NUM_FRAMES + 8, 25 + 25 + 4, 54 - 28, 0, True)


def test_plain_rule_chunk_schedule(plain_rule_engine):
    """`codec_chunk_doubling: false`: the plain window rule (docs/model.md#chunk-doubling), C frames
    right after the first chunk."""
    res, windows = _run_recorded(plain_rule_engine, speech("p", TEXT, sampling(0.8, 5, NUM_FRAMES), stream=True))
    sizes = [c.num_frames for c in res.chunks]
    assert sizes == expected_chunk_sizes(NUM_FRAMES, 25, 4, 1, doubling=False) == [1, 25, 25, 9]
    assert windows[0] == (7 + 1 + 4, 1 + 4, 0, 4, False)
    # later chunks: when D - H - emitted reaches C; the window re-decodes min(L, emitted) frames
    assert windows[1] == (7 + 26 + 4, 1 + 25 + 4, 1, 4, False)
    assert windows[2] == (7 + 51 + 4, 25 + 25 + 4, 25, 4, False)
    assert windows[3] == (NUM_FRAMES + 8, 25 + 25 + 4, 54 - 9, 0, True)  # widened, as above


def test_non_streamed_request_is_one_shot_and_same_codes(default_engine, tiny_loaded):
    streamed, _ = _run_recorded(default_engine, speech("a", TEXT, sampling(0.8, 5, NUM_FRAMES), stream=True))
    (whole,) = default_engine.generate([speech("b", TEXT, sampling(0.8, 5, NUM_FRAMES), stream=False)])
    np.testing.assert_array_equal(streamed.rows, whole.rows)
    # decoded in exact chunks as it was generated (chunker.file_window_params): 25 + 25 + the rest
    assert [c.num_frames for c in whole.chunks] == [25, 25, NUM_FRAMES - 50]
    assert [c.is_final for c in whole.chunks] == [False, False, True]
    oneshot = _decode(tiny_loaded, whole.frames)
    np.testing.assert_allclose(whole.audio, oneshot, rtol=0, atol=1e-6 * np.abs(oneshot).max())


def test_wide_window_stream_equals_one_shot(wide_engine, tiny_loaded, receptive_field):
    left_rf, right_rf = receptive_field
    params = wide_engine.core.outputs.window
    assert params.left_context_frames >= left_rf and params.right_holdback_frames >= right_rf
    res, _ = _run_recorded(wide_engine, speech("w", TEXT, sampling(0.8, 5, NUM_FRAMES), stream=True))
    assert [c.num_frames for c in res.chunks] == expected_chunk_sizes(NUM_FRAMES, 25, 16, 1) == [1, 1, 2, 4, 8, 16, 28]
    oneshot = _decode(tiny_loaded, res.frames)
    assert len(res.audio) == len(oneshot) == NUM_FRAMES * SAMPLES_PER_FRAME
    error = np.abs(res.audio - oneshot).max() / np.abs(oneshot).max()
    assert error <= TOLERANCE, f"wide-window stream differs from one-shot by {error:.2e} of peak"


def test_default_window_seam_error_confined_near_seams(default_engine, tiny_loaded, receptive_field):
    _, right_rf = receptive_field
    holdback = default_engine.core.outputs.window.right_holdback_frames
    res, _ = _run_recorded(default_engine, speech("d", TEXT, sampling(0.0, 0, NUM_FRAMES), stream=True))
    oneshot = _decode(tiny_loaded, res.frames)
    peak = np.abs(oneshot).max()
    error = (np.abs(res.audio - oneshot) / peak).reshape(NUM_FRAMES, SAMPLES_PER_FRAME).max(axis=1)
    # A chunk ending at seam s was decoded without frames >= s + H, which the last
    # (right_rf - H) frames before s can see: only those may differ.
    near_seam = np.zeros(NUM_FRAMES, dtype=bool)
    for seam in _seams(res):
        near_seam[max(0, seam - (right_rf - holdback)) : seam] = True
    assert error[~near_seam].max() <= TOLERANCE, f"error away from seams: {error[~near_seam].max():.2e}"
    # the seam error is real with H < receptive field (documented, not hidden)
    assert right_rf > holdback and error[near_seam].max() > 1e-3


def _stream_offline(loaded, frames: np.ndarray, params: WindowParams) -> np.ndarray:
    """The window rule (docs/model.md#streaming-windows) applied to a fixed frame sequence, each
    window decoded alone."""
    chunker = StreamChunker(params)
    pieces = []
    for available in [*range(1, len(frames) + 1), len(frames)]:
        window = chunker.push(available, finished=chunker.frames_seen == len(frames))
        if window is not None and window.num_frames:
            audio = _decode(loaded, frames[window.start_frame : window.end_frame])
            pieces.append(audio[window.trim_front_samples : len(audio) - window.trim_back_samples])
    return np.concatenate(pieces)


def test_smallest_exact_holdback_is_the_receptive_field(tiny_loaded, receptive_field):
    """Offline sweep of H with L = 40 over random frames: the first H with error <= TOLERANCE."""
    _, right_rf = receptive_field
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 1024, size=(NUM_FRAMES, 8))
    oneshot = _decode(tiny_loaded, frames)
    peak = np.abs(oneshot).max()

    def stream_error(holdback: int) -> float:
        return float(np.abs(_stream_offline(tiny_loaded, frames, WindowParams(25, 40, holdback, 1)) - oneshot).max()
                     / peak)

    assert stream_error(right_rf) <= TOLERANCE
    assert stream_error(right_rf - 1) > TOLERANCE


def test_left_context_past_the_receptive_field_changes_nothing(tiny_loaded):
    """L = the decoder's left receptive field (10, the full_and_piecewise profile) streams the same
    audio as the profiles' L = 25, to float rounding; half of it does not."""
    left, _ = receptive_field_frames(tiny_loaded.spec.codec)
    frames = np.random.default_rng(2).integers(0, 1024, size=(NUM_FRAMES, 8))
    reference = _stream_offline(tiny_loaded, frames, WindowParams(25, 25, 4, 1))
    peak = np.abs(reference).max()
    exact = _stream_offline(tiny_loaded, frames, WindowParams(25, left, 4, 1))
    assert np.abs(exact - reference).max() <= 1e-5 * peak
    short = _stream_offline(tiny_loaded, frames, WindowParams(25, left // 2, 4, 1))
    assert np.abs(short - reference).max() > TOLERANCE * peak


@pytest.mark.parametrize("total", [39, 40, 52, 63])
def test_a_widened_final_window_decodes_what_the_rules_final_window_decodes(tiny_loaded, total):
    """chunker.widen_final: more left context (past the receptive field) and the last C + H frames
    decoded, then cut to the new ones: the rule's audio, to float rounding, for final windows of
    1 to C + H new frames."""
    params = WindowParams(25, 10, 4, 1)  # the full_and_piecewise window
    frames = np.random.default_rng(total).integers(0, 1024, size=(total, 8))
    chunker = StreamChunker(params)
    for available in range(1, total):
        chunker.push(available, finished=False)
    final = chunker.push(total, finished=True)
    widened = widen_final(final, params)
    assert widened.shape == final_window_shape(params) and widened.new_frames == final.new_frames

    def kept(window):
        with torch.inference_mode():
            codes = torch.from_numpy(frames[window.start_frame : window.end_frame])[None]
            audio = tiny_loaded.codec(codes, window.shape.keep)[0].float().numpy()
        return audio[(window.trim_front_frames - window.shape.keep_start) * SAMPLES_PER_FRAME :]

    want, got = kept(final), kept(widened)
    assert len(got) == len(want) == final.new_frames * SAMPLES_PER_FRAME
    assert np.abs(got - want).max() <= TOLERANCE * np.abs(want).max()


@pytest.mark.parametrize("initial, sizes", [(10, [10, 10, 20, 20]), (0, [25, 25, 10]), (25, [25, 25, 10])])
def test_per_request_initial_chunk(default_engine, initial, sizes):
    """SpeechRequest.initial_chunk_frames (the API's initial_codec_chunk_frames) replaces the
    profile's first chunk for that request only; the rest of the rule is the profile's."""
    params = sampling(0.8, 3, NUM_FRAMES, min_frames=NUM_FRAMES)
    request = SpeechRequest("ic", TEXT, params, stream=True, initial_chunk_frames=initial)
    res, plain = default_engine.generate([request, speech("plain", TEXT, params, stream=True)])
    assert [c.num_frames for c in res.chunks] == expected_chunk_sizes(NUM_FRAMES, 25, 4, initial) == sizes
    assert [c.num_frames for c in plain.chunks][:2] == [1, 1]  # its batch-mate keeps the profile's
    np.testing.assert_array_equal(res.rows, plain.rows)  # same codes: only the chunking differs
