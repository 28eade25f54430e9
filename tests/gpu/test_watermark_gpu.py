"""The watermark on CUDA (where the engine runs it: the codec's device, its own stream): the same
mark as on the CPU to float rounding (TF32 off, as the codec's float32 contract), found by the
CPU detector, batches equal to single windows. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import torch

from higgs_serve.audio.watermark import MarkStream, detect, embed, load_watermarker
from support.speechlike import speechlike


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
