"""PerTh's detector over a clip of any length in bounded memory (docs/model.md#watermark).

`PerthNet.detect` over a whole clip holds the clip's full STFT ([769, T] complex: 184 MB for
300 s) and each stack's hidden activations over every frame ([256, T]: 38 MB a layer). Here:

- `ClipScorer.push(samples)` takes 24 kHz audio as it is decoded and computes its STFT frames
  STFT_BLOCK_FRAMES at a time (the same centred, reflect-padded frames as `torch.stft(center=True)`), keeping
  only what detection reads: the low bins' features ([128, T] float32: 15 MB for 300 s) and each
  frame's feature sum over all bins (for the frame mask);
- `finish()` runs each detection stack over the frames in blocks of BLOCK_FRAMES with
  RECEPTIVE_HALF_FRAMES of real neighbours either side (zeros only at the clip's true edges), so
  every output frame sees exactly what it sees in one pass over the whole clip; the interpolation
  to each stack's frame rate and the mask's nearest-frame mapping are computed per block with
  the formulas torch uses (linear with aligned corners; nearest).

The score equals `PerthWatermarker.score` (the whole clip at once, which the engine's tests and the
quality benchmark use) to float rounding (tests/unit/test_perth_score.py).
`finish` also reports how the 1x stack's per-frame scores spread: marked speech is marked in
nearly every frame it judges, while content that merely looks marked to the network (tones, some
music) tends to score in parts (audio/watermark_detect.py reads it).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from higgs_serve.audio.perth.network import (
    DETECT_TIME_SCALES,
    HOP,
    MARK_BINS,
    MASK_FRACTION,
    SAMPLE_RATE_HZ,
    N_FFT,
    RECEPTIVE_HALF_FRAMES,
    PerthWatermarker,
)

BLOCK_FRAMES = 2048  # output frames per detection block (20 s of audio)
# frames per STFT block: its complex spectrum and features over all 769 bins are the largest
# transients here (~3 MB each at 512 frames)
STFT_BLOCK_FRAMES = 512
_PAD = N_FFT // 2  # torch.stft(center=True) pads half a window, reflected, at each end
FRAME_SCORE_MARKED = 0.5  # a frame whose (1x stack) score is above this reads as marked


@dataclass(frozen=True)
class ScoreDetail:
    score: float  # 0..1, as PerthNet.detect
    judged_frames: int  # frames in the mask (loud enough to carry the mark)
    marked_frame_fraction: float  # of those, the share the 1x stack scores above FRAME_SCORE_MARKED


class ClipScorer:
    """One clip's detection, fed in blocks (one thread; the model is shared read-only, so any
    number of scorers may run at once on one `PerthWatermarker`)."""

    def __init__(self, watermarker: PerthWatermarker, max_seconds: float | None = None):
        """max_seconds: the longest clip this scorer will be given, if known: its feature store
        is reserved once (address space only; pages are touched as frames arrive), so no
        allocation outlives the blocks' transients in between (a heap that cannot shrink)."""
        self._net, self._device = watermarker.net, watermarker.device
        self._window = torch.hann_window(N_FFT, periodic=True, device=self._device)  # as its STFT
        self._head: np.ndarray | None = np.zeros(0, np.float32)  # first samples, until padded
        self._tail = np.zeros(0, np.float32)  # padded samples not yet framed
        self._seen = 0  # samples pushed
        self._last = np.zeros(0, np.float32)  # the last _PAD + 1 samples (for the end's reflection)
        capacity = 1 + int(max_seconds * SAMPLE_RATE_HZ) // HOP if max_seconds else 1024
        self._low = np.empty((MARK_BINS, capacity), np.float32)  # [128, T] low bins' features
        self._energy = np.empty(capacity, np.float32)  # [T] each frame's features summed
        self._frames = 0

    def push(self, samples: np.ndarray) -> None:
        """[n] float32 at 24 kHz, in order."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.size == 0:
            return
        self._seen += samples.size
        self._last = np.concatenate([self._last, samples])[-(_PAD + 1):]
        if self._head is not None:  # the left reflection needs the first _PAD + 1 samples
            self._head = np.concatenate([self._head, samples])
            if self._head.size <= _PAD:
                return
            samples, self._head = self._head, None
            samples = np.concatenate([samples[1:_PAD + 1][::-1], samples])
        self._tail = np.concatenate([self._tail, samples])
        self._frame(final=False)

    def finish(self) -> ScoreDetail:
        """The clip's score; 0 (nothing judged) for a clip of at most one STFT window."""
        if self._seen <= N_FFT:
            return ScoreDetail(0.0, 0, 0.0)
        self._tail = np.concatenate([self._tail, self._last[-(_PAD + 1):-1][::-1]])
        self._frame(final=True)
        low, energy = self._low[:, :self._frames], self._energy[:self._frames]
        mask = (energy > energy.max() * MASK_FRACTION).astype(np.float32)
        return self._detect(low, mask)

    # ------------------------------------------------------------------ features
    def _frame(self, final: bool) -> None:
        """Frame every complete window in the buffer, `BLOCK_FRAMES` at a time."""
        while True:
            frames = (self._tail.size - N_FFT) // HOP + 1 if self._tail.size >= N_FFT else 0
            if frames == 0 or (frames < STFT_BLOCK_FRAMES and not final):
                return
            frames = min(frames, STFT_BLOCK_FRAMES)
            used = (frames - 1) * HOP + N_FFT
            self._features(self._tail[:used])
            self._tail = self._tail[frames * HOP:]

    @torch.inference_mode()
    def _features(self, padded: np.ndarray) -> None:
        audio = torch.from_numpy(np.ascontiguousarray(padded)).to(self._device)
        spec = torch.stft(audio, N_FFT, HOP, window=self._window, center=False, return_complex=True)
        feats = self._net.features(spec[None])  # [1, F, t]
        frames = feats.shape[-1]
        end = self._frames + frames
        if end > self._energy.size:  # past the reserve: doubled
            grown = max(end, 2 * self._energy.size)
            self._low = np.concatenate([self._low[:, :self._frames],
                                        np.empty((MARK_BINS, grown - self._frames), np.float32)], axis=1)
            self._energy = np.concatenate([self._energy[:self._frames], np.empty(grown - self._frames, np.float32)])
        self._energy[self._frames:end] = feats.sum(1)[0].cpu().numpy()
        self._low[:, self._frames:end] = feats[0, :MARK_BINS].cpu().numpy()
        self._frames = end
        del spec, feats
        release_freed_memory()

    # ------------------------------------------------------------------ detection
    @torch.inference_mode()
    def _detect(self, low: np.ndarray, mask: np.ndarray) -> ScoreDetail:
        frames = low.shape[1]
        attention, scores, marked = [], [], 0.0
        for scale, stack in zip(DETECT_TIME_SCALES, self._net.detectors):
            size = frames if scale == 1.0 else int(frames * scale)
            sums = torch.zeros(2, dtype=torch.float32)  # masked (attention, score) sums
            count, above = 0.0, 0.0
            for start in range(0, size, BLOCK_FRAMES):
                stop = min(start + BLOCK_FRAMES, size)
                lo, hi = max(start - RECEPTIVE_HALF_FRAMES, 0), min(stop + RECEPTIVE_HALF_FRAMES, size)
                x = torch.from_numpy(_linear(low, size, lo, hi)).to(self._device)
                out = stack(x[None])[0, :, start - lo: stop - lo].float().cpu()  # [2, t]
                m = torch.from_numpy(_nearest(mask, size, start, stop))
                sums += (out * m).sum(-1)
                count += float(m.sum())
                if scale == 1.0:
                    above += float(((out[1] > FRAME_SCORE_MARKED).float() * m).sum())
                del x, out
                release_freed_memory()
            pooled = sums / max(count, 1.0)
            attention.append(pooled[0])
            scores.append(pooled[1])
            if scale == 1.0:
                marked = above / max(count, 1.0)
        weights = torch.softmax(torch.stack(attention), dim=0)
        score = float((torch.stack(scores) * weights).sum().clamp(0.0, 1.0))
        return ScoreDetail(score, int(mask.sum()), marked)


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim). Each block's
    transients are freed, but glibc keeps freed heap memory mapped, and small allocations made in
    between (Python's own) keep the heap from shrinking: without this, one 300 s detection grew
    the process by ~180 MB though it never held more than ~30 MB (benchmarks/results/
    detect_memory_cpu.json). Costs well under a millisecond a call, one call per block."""
    if _TRIM is not None:
        _TRIM(0)


def _linear(low: np.ndarray, size: int, lo: int, hi: int) -> np.ndarray:
    """Frames lo..hi of `low` [128, T] resampled in time to `size` frames, as
    F.interpolate(mode="linear", align_corners=True) computes them (float32 positions)."""
    frames = low.shape[1]
    if size == frames:
        return np.ascontiguousarray(low[:, lo:hi])
    scale = np.float32((frames - 1) / (size - 1)) if size > 1 else np.float32(0.0)
    position = np.arange(lo, hi, dtype=np.float32) * scale
    left = np.minimum(position.astype(np.int64), frames - 1)
    right = np.minimum(left + 1, frames - 1)
    weight = (position - left).astype(np.float32)
    return (low[:, left] * (1 - weight) + low[:, right] * weight).astype(np.float32)


def _nearest(mask: np.ndarray, size: int, start: int, stop: int) -> np.ndarray:
    """Entries start..stop of `mask` [T] stretched to `size`, as F.interpolate(mode="nearest")."""
    frames = mask.shape[0]
    scale = np.float32(frames / size)
    index = np.minimum((np.arange(start, stop, dtype=np.float32) * scale).astype(np.int64), frames - 1)
    return mask[index]


def score_clip(watermarker: PerthWatermarker, audio: np.ndarray) -> ScoreDetail:
    """A whole clip [n] float32 at 24 kHz, scored as a stream."""
    scorer = ClipScorer(watermarker)
    for start in range(0, audio.size, STFT_BLOCK_FRAMES * HOP):
        scorer.push(audio[start: start + STFT_BLOCK_FRAMES * HOP])
    return scorer.finish()
