"""The mark in one call (audio/perth/rows.py, perth/runner.py, perth/network.py `mark_change`) on the CPU:
every window gets bit for bit the change the per-length path gave it before
(support/perth_reference.py) whatever else shares its call; a stream marked through the engine's
mark stage beside other streams is the stream marked alone; and the padded batch the GPU runs
(rows of different lengths in one bucket) gives each window its own mark, to the rounding of
wider kernels. Why padding with earlier audio or silence would not do: the last test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from higgs_serve.audio.perth.network import mark_change
from higgs_serve.audio.perth.rows import HOP, fill_rows, row_samples, window_frames
from higgs_serve.audio.watermark import MarkStream, load_watermarker
from higgs_serve.engine.async_engine import CollectingSink
from higgs_serve.engine.mark_stage import MarkStage
from higgs_serve.engine.speech import AudioChunk
from support.perth_reference import per_length_residuals
from support.speechlike import speechlike

FRAME = 960  # samples per codec frame
STREAM_SCHEDULE = (1, 1, 2, 4, 8, 16, 25, 25, 18)  # codec frames per chunk: the shipped ramp, a final chunk


@pytest.fixture(scope="module")
def wm():
    return load_watermarker("perth", "cpu")


@pytest.fixture(scope="module")
def windows(wm):
    return mixed_windows(wm)


@pytest.fixture(scope="module")
def reference(wm, windows):
    return per_length_alone(wm, windows)


def stream_windows(audio: np.ndarray, schedule, context_samples: int) -> tuple[list, list]:
    """(chunks, windows) of one stream chunked on `schedule` (codec frames per chunk)."""
    stream, pos, chunks, windows = MarkStream(context_samples), 0, [], []
    for frames in schedule:
        chunks.append(audio[pos: pos + frames * FRAME])
        pos += chunks[-1].size
        windows.append(stream.window(chunks[-1]))
    return chunks, windows


def mixed_windows(wm) -> list[np.ndarray]:
    """Every window of three streams' schedules, and windows no stream makes (shorter than the
    STFT's edge, not a whole number of hops, silence)."""
    windows = []
    for seed in range(3):
        windows += stream_windows(speechlike(6.0, seed), STREAM_SCHEDULE, wm.context_samples)[1]
    odd = speechlike(1.0, 9)
    return windows + [odd[:300], odd[:769], odd[:5000], odd[:12345], np.zeros(4800, np.float32)]


def per_length_alone(wm, windows) -> list[np.ndarray]:
    """The per-length path as the CPU engine ran it: one window a call (its batches of equal
    lengths rounded differently with their size: why the CPU stage took one at a time)."""
    return [per_length_residuals(wm, [w])[0] for w in windows]


def test_each_window_gets_bit_for_bit_its_per_length_change(wm, windows, reference):
    together = wm.residuals(windows)  # one call: 32 windows of 16 lengths
    for window, got, want in zip(windows, together, reference, strict=True):
        assert got.shape == window.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got, want, err_msg=f"window of {window.size} samples")
    assert max(np.abs(c).max() for c in together) > 0.01  # marked, not trivially equal


def test_a_windows_change_does_not_depend_on_its_call(wm, windows, reference):
    rng = np.random.default_rng(0)
    for size in (12, 5):  # other companions, other positions
        order = rng.permutation(len(windows))[:size]
        for i, got in zip(order, wm.residuals([windows[i] for i in order])):
            np.testing.assert_array_equal(got, reference[i])


@pytest.mark.parametrize("bucket", [128, 256])
def test_the_padded_batch_gives_each_window_its_own_mark(wm, windows, reference, bucket):
    """What the GPU runs: every window in one padded batch of `bucket` frames. Equal to the
    per-length change to float rounding (wider matrices take other kernels); a padding that
    leaked into a window would move its mark by 0.7 % or more (the next test)."""
    rows = np.empty((len(windows) + 2, row_samples(bucket)), np.float32)  # two spare rows, as a graph's
    valid = np.empty((len(windows) + 2, bucket), np.float32)
    spans = fill_rows(windows, rows, valid)
    assert max(window_frames(w.size) for w in windows) < bucket
    with torch.inference_mode():
        change = mark_change(wm.net, torch.hann_window(1536, periodic=True), torch.from_numpy(rows),
                             torch.from_numpy(valid)).numpy()
    assert change.shape == (len(windows) + 2, HOP * bucket)
    for i, ((start, end), want) in enumerate(zip(spans, reference)):
        assert np.abs(change[i, start:end] - want).max() <= 1e-5 * max(np.abs(want).max(), 1e-3), i


def test_a_stream_marked_beside_others_is_the_stream_marked_alone(wm):
    """Through the engine's mark stage: three streams on different schedules share its calls."""
    schedules = {0: STREAM_SCHEDULE, 1: (1, 1, 2, 4, 8, 16, 25, 7), 2: (25, 25, 25, 12)}
    audio = {s: speechlike(6.0, 20 + s) for s in schedules}
    stage = MarkStage(wm, max_batch_windows=8)
    sinks = {s: CollectingSink(None, str(s)) for s in schedules}
    wrapped = {s: stage.wrap(sinks[s]) for s in schedules}
    chunks = {s: stream_windows(audio[s], schedules[s], wm.context_samples)[0] for s in schedules}
    for step in range(max(len(c) for c in chunks.values())):  # interleaved, as the codec delivers them
        for s in schedules:
            if step < len(chunks[s]):
                wrapped[s].put(AudioChunk(chunks[s][step], step == len(chunks[s]) - 1, 0, None))
    stage.start()
    for sink in sinks.values():
        assert sink.done.wait(60)
    stage.stop()
    assert stage.counters.calls < sum(len(c) for c in chunks.values())  # windows shared calls
    for s in schedules:
        _, windows = stream_windows(audio[s], schedules[s], wm.context_samples)
        alone = [MarkStream.apply(c, wm.residuals([w])[0]) for c, w in zip(chunks[s], windows)]
        np.testing.assert_array_equal(np.concatenate([c.audio for c in sinks[s].chunks]), np.concatenate(alone))


def test_padding_a_streams_first_windows_with_silence_would_change_their_mark(wm):
    """Why rows are not simply padded with silence (or audio) before the window: a stream's
    first chunks (0 to 80 ms of context) lie within the network's reach of the window's start
    (the STFT's reflected edge, the convolutions' zero padding, the inverse STFT's
    normalisation: perth/rows.py's note), so what precedes the window changes their mark."""
    chunks, windows = stream_windows(speechlike(3.0, 3), (1, 1, 2), wm.context_samples)
    silence = np.zeros(wm.context_samples, np.float32)
    for chunk, window in zip(chunks, windows):  # measured: 9 %, 3 % and 0.7 % of the chunk's mark
        own, padded = per_length_residuals(wm, [window, np.concatenate([silence, window])])
        n = chunk.size
        assert np.abs(own[-n:] - padded[-n:]).max() > 3e-3 * np.abs(own[-n:]).max(), window.size
