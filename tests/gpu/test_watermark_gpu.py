"""The watermark on CUDA (where the engine runs it: the codec's device, its own stream): the same
mark as on the CPU to float rounding (TF32 off, as the codec's float32 contract), found by the
CPU detector, batches equal to single windows; and the padded batch replayed as CUDA graphs
(audio/perth/runner.py): every (bucket, batch) captured, each window's change the eager one's
and the per-length path's, whatever shares its call. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import torch

from higgs_serve.audio.perth.rows import length_ladder
from higgs_serve.audio.watermark import MarkStream, detect, embed, load_watermarker
from higgs_serve.graph_batches import graph_batch_sizes
from support.perth_reference import per_length_residuals
from support.speechlike import speechlike

FRAME = 960
CHUNK = 25 * FRAME  # the shipped profiles' steady chunk
TOLERANCE = 1e-4  # absolute, as the batch test above: float rounding of one GPU's kernels


def test_cuda_marks_as_the_cpu_does():
    torch.backends.cudnn.allow_tf32 = False
    cpu, gpu = load_watermarker("perth", "cpu"), load_watermarker("perth", "cuda")
    audio = speechlike(8.0, 21)
    on_gpu, on_cpu = embed(gpu, audio), embed(cpu, audio)
    change = on_cpu - audio
    assert np.max(np.abs((on_gpu - audio) - change)) < 1e-3 * np.max(np.abs(change))
    assert detect(cpu, on_gpu, 24_000).detected
    windows = [speechlike(1.22, seed) for seed in range(16)]  # one length: one batch
    together = gpu.residuals(windows)
    for window, residual in zip(windows, together):
        np.testing.assert_allclose(residual, gpu.residuals([window])[0], rtol=0, atol=1e-4)


def test_a_stream_marked_on_cuda_is_detected():
    gpu = load_watermarker("perth", "cuda")
    audio = speechlike(5.0, 22)
    stream, pos, out = MarkStream(gpu.context_samples), 0, []
    for frames in (1, 1, 2, 4, 8, 16, 25, 25, 25, 18):
        chunk = audio[pos: pos + frames * 960]
        pos += chunk.size
        out.append(stream.apply(chunk, gpu.residuals([stream.window(chunk)])[0]))
    assert detect(gpu, np.concatenate(out), 24_000).detected


def stream_windows(seed: int, schedule, context_samples: int) -> list[np.ndarray]:
    audio = speechlike(6.0, seed)
    stream, pos, windows = MarkStream(context_samples), 0, []
    for frames in schedule:
        windows.append(stream.window(audio[pos: pos + frames * FRAME]))
        pos += frames * FRAME
    return windows


def test_the_graphs_mark_every_window_as_the_eager_per_length_path_does():
    torch.backends.cudnn.allow_tf32 = False
    graphs, eager = load_watermarker("perth", "cuda"), load_watermarker("perth", "cuda")
    info = graphs.prepare(64, CHUNK)
    ladder = length_ladder(graphs.context_samples + CHUNK)
    assert ladder == (16, 32, 64, 128)
    assert graphs.runner.graph_shapes == sorted((f, b) for f in ladder for b in graph_batch_sizes(64))
    assert info["graphs"] == len(ladder) * len(graph_batch_sizes(64))
    windows = [w for seed in range(6) for w in stream_windows(seed, (1, 1, 2, 4, 8, 16, 25, 25, 18),
                                                               graphs.context_samples)]
    together = graphs.residuals(windows)  # 54 windows of every length: one replay
    assert graphs.runner.graph_calls == 1 and graphs.runner.eager_calls == 0
    reference = per_length_residuals(eager, windows)
    for window, got, want in zip(windows, together, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE, err_msg=f"{window.size} samples")
    assert max(np.abs(c).max() for c in together) > 0.01


def test_a_windows_graph_mark_does_not_depend_on_what_shares_its_call():
    torch.backends.cudnn.allow_tf32 = False
    gpu = load_watermarker("perth", "cuda")
    gpu.prepare(64, CHUNK)
    windows = [w for seed in range(10) for w in stream_windows(10 + seed, (1, 2, 8, 25), gpu.context_samples)]
    alone = [gpu.residuals([w])[0] for w in windows]  # batch 1, each window's own bucket
    rng = np.random.default_rng(1)
    for size in (3, 17, 40):  # other batch sizes (padded to the captured ones), other buckets
        chosen = rng.choice(len(windows), size, replace=False)
        for i, got in zip(chosen, gpu.residuals([windows[i] for i in chosen])):
            np.testing.assert_allclose(got, alone[i], rtol=0, atol=TOLERANCE)
    calls = gpu.runner.graph_calls
    many = gpu.residuals(windows)  # 40 windows in one call; then a window no graph holds (eager)
    long_window = speechlike(3.0, 5)
    (long_change,) = gpu.residuals([long_window])
    assert gpu.runner.graph_calls == calls + 1 and gpu.runner.eager_calls == 1
    for got, want in zip(many, alone):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(long_change, per_length_residuals(gpu, [long_window])[0], rtol=0, atol=TOLERANCE)
