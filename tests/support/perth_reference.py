"""The watermark's per-length path as it ran before the padded batch (audio/perth/network.py at cc61cc4,
`PerthWatermarker._batch_residuals`): windows of one length stacked and marked together, each on
a centred STFT of its own samples, its frame mask against its own loudest frame, the embedder's
convolutions with 'same' zero padding (`ConvStack.forward`), torch.istft. The padded batch must
give each window exactly this (tests/unit/test_watermark_batch.py, tests/gpu/test_watermark_gpu.py).

Its convolutions are `ConvStack.forward`'s without a validity mask: on the CPU the GEMM form up to
`perth.GEMM_MAX_FRAMES` frames and torch's convolution above, as then."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from higgs_serve.audio.perth import network as perth


def per_length_residuals(wm: perth.PerthWatermarker, windows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each window [n_i] float32 -> its change [n_i], windows of one length in one batch."""
    out: list[np.ndarray | None] = [None] * len(windows)
    by_length: dict[int, list[int]] = {}
    for i, window in enumerate(windows):
        by_length.setdefault(len(window), []).append(i)
    for indices in by_length.values():
        for i, change in zip(indices, _batch([windows[i] for i in indices], wm)):
            out[i] = change
    return out


@torch.inference_mode()
def _batch(windows: list[np.ndarray], wm: perth.PerthWatermarker) -> list[np.ndarray]:
    net, hann = wm.net, torch.hann_window(perth.N_FFT, periodic=True, device=wm.device)
    audio = torch.stack([torch.from_numpy(np.asarray(w, np.float32)).to(wm.device) for w in windows])  # [B, n]
    n = audio.shape[-1]
    if n <= perth.N_FFT // 2:  # too short to reflect the STFT's edges: silence before it
        audio = F.pad(audio, (perth.N_FFT // 2 + 1 - n, 0))
    spec = torch.stft(audio, perth.N_FFT, perth.HOP, window=hann, center=True, pad_mode="reflect",
                      return_complex=True)  # [B, F, T]
    feats = net.features(spec)
    residual = net.embedder(feats[:, :perth.MARK_BINS]) * perth.frame_mask(feats)[:, None]
    gain = torch.pow(10.0, residual * (perth.DB_SPAN / 20.0))
    delta = torch.zeros_like(spec)
    delta[:, :perth.MARK_BINS] = spec[:, :perth.MARK_BINS] * (gain - 1.0)
    change = torch.istft(delta, perth.N_FFT, perth.HOP, window=hann, center=True, length=audio.shape[-1])
    return list(change[:, -n:].float().cpu().numpy())
