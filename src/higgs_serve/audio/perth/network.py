"""PerTh, the watermark implementation: its network, run on our own STFT at 24 kHz
(docs/model.md#watermark). `PerthWatermarker` is audio/watermark.py's `Watermarker`.

The trained weights come from the `resemble-perth` wheel (MIT, Resemble AI), which ships them
inside the package; nothing is downloaded. Its own Python wrapper is not used: it imports
torchaudio (whose PyPI wheels are CUDA builds tied to one torch release, so it does not load with
the CPU torch this project installs), librosa (numba, llvmlite, scipy, scikit-learn) and
`pkg_resources` (gone from setuptools 81 on), and it silently sets itself to None when any of
those fails. We read the checkpoint file directly (`find_checkpoint`, without importing
the `perth` package) and run the two small convolution stacks below.

What the network does, in our words:
- Features: the STFT log-magnitude, `20 log10(max(|X|, 1e-9))`, mapped to [0, ~1] by
  `(dB + 180) / 195`. The network was trained at 32 kHz with a 2048-point Hann window and a
  320-sample hop: 15.625 Hz per bin and 100 frames per second. At our 24 kHz the same grid is a
  1536-point window and a 240-sample hop, and the magnitudes of one signal differ by the rate
  ratio 32/24 (a DFT sums fs times more samples per second), so features are computed from
  `|X| * 4/3`. Only the first 128 bins (0 to 2 kHz) are ever changed or read by the stacks.
- Frame mask: frames whose summed features over all bins exceed 5 % of the clip's largest sum
  (silence carries no mark and is not judged).
- Embedding: a stack of 1-D convolutions over time (channels = the 128 low bins) outputs a
  feature-domain residual; times the mask, it is added to the low-bin features, i.e. each low
  bin's magnitude is multiplied by `10 ** (195 * residual / 20)`, phase kept. Every other bin is
  untouched, so the change to the signal is exactly the inverse STFT of the changed low bins.
  On a GPU windows of any lengths are marked together in one padded batch, each exactly as
  alone (perth/rows.py says how; perth/runner.py runs it, as CUDA graphs); on the CPU one by one.
- Detection: three such stacks read the low-bin features at 1.25x, 1x and 0.75x the frame rate
  (linear interpolation in time); each outputs per-frame (attention, score) pairs, averaged over
  masked frames; the three scores are combined with softmax(attention) weights and clipped to
  [0, 1]. A score near 1 means marked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from higgs_serve.audio.perth.rows import EDGE, HOP, N_FFT, row_samples
from higgs_serve.audio.perth.runner import MarkRunner
from higgs_serve.errors import WatermarkUnavailableError

# Where the wheel keeps the trained model, relative to the installed `perth` package.
CHECKPOINT_RELPATH = ("perth_net", "pretrained", "implicit", "perth_net_250000.pth.tar")
SAMPLE_RATE_HZ = 24_000
# N_FFT 1536 (64 ms, the trained 2048 points at 32 kHz) and HOP 240 (10 ms, the trained 320
# samples): the STFT grid, written once in perth/rows.py (which lays windows into padded rows)
MARK_BINS = 128  # 0 to 2 kHz at 15.625 Hz per bin
HIDDEN = 256
KERNEL = 7  # the five middle convolutions of each stack; the first and last are 1 wide
MIDDLE_LAYERS = 5
# The features the network was trained on were computed at 32 kHz (see the module note).
TRAINED_RATE_SCALE = 32_000 / SAMPLE_RATE_HZ
FLOOR = 1e-9
FLOOR_DB = -180.0
DB_SPAN = 195.0  # FLOOR_DB to +15 dB headroom
MASK_FRACTION = 0.05
DETECT_TIME_SCALES = (1.25, 1.0, 0.75)
# frames of context either side that one output frame of a stack depends on
RECEPTIVE_HALF_FRAMES = MIDDLE_LAYERS * (KERNEL // 2)

# checkpoint stack prefix -> ours; the STFT buffers the wrapper kept in its state are unused here
_STACKS = {"encoder.layers": "embedder", "decoder.slow_layers": "detectors.0",
           "decoder.normal_layers": "detectors.1", "decoder.fast_layers": "detectors.2"}
_UNUSED = ("ap.spectrogram.window", "ap.inv_spectrogram.window", "ap.stretch.phase_advance")


def find_checkpoint() -> Path:
    """The trained model's file inside the installed `resemble-perth` package (the package is
    located, not imported: importing it runs its wrapper's imports)."""
    spec = importlib.util.find_spec("perth")
    if spec is None or not spec.submodule_search_locations:
        raise WatermarkUnavailableError("the watermark needs the resemble-perth package (pip install resemble-perth==1.0.1)")
    path = Path(next(iter(spec.submodule_search_locations)), *CHECKPOINT_RELPATH)
    if not path.is_file():
        raise WatermarkUnavailableError(f"resemble-perth is installed but its trained model is missing ({path})")
    return path


# On the CPU, windows of at most this many frames run their convolutions as one GEMM over the
# stacked taps: a stream's first chunk (5 frames) is marked in 2.0 ms instead of 4.0 (torch's
# CPU convolution has a fixed cost of ~0.5 ms a layer); from ~25 frames on the two are even, and
# the taps' copy grows with the window (measured on this project's 2-core CPU machine, one thread).
GEMM_MAX_FRAMES = 16


class ConvStack(nn.Module):
    """[B, 128, T] features -> [B, out, T]: 1-wide conv, five 7-wide convs, 1-wide conv, with
    LeakyReLU(0.01) after every conv but the last; 'same' zero padding in time."""

    def __init__(self, out_channels: int):
        super().__init__()
        widths = [MARK_BINS] + [HIDDEN] * (MIDDLE_LAYERS + 1) + [out_channels]
        kernels = [1] + [KERNEL] * MIDDLE_LAYERS + [1]
        self.convs = nn.ModuleList(
            nn.Conv1d(widths[i], widths[i + 1], k, padding=k // 2) for i, k in enumerate(kernels))
        self._taps: list[torch.Tensor] | None = None  # [out, k * in] per conv, built at first use

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, 128, T] -> [B, out, T]. With `valid` [B, T] (a padded batch, perth/rows.py; 1: a
        frame of the row's window) the input of every 7-wide convolution is zero outside the
        window, as 'same' padding makes it when the window runs alone, so the window's frames get
        what they get alone."""
        as_gemm = x.device.type == "cpu" and x.shape[-1] <= GEMM_MAX_FRAMES
        for i, conv in enumerate(self.convs):
            if valid is not None and conv.kernel_size[0] > 1:
                x = x * valid[:, None]
            x = self._gemm(i, conv, x) if as_gemm else conv(x)
            if i < len(self.convs) - 1:
                x = F.leaky_relu(x, 0.01)
        return x

    def _gemm(self, i: int, conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
        """conv(x) as bias + W @ taps: x [B, C, T] -> [B, O, T]."""
        if self._taps is None:  # weights [O, C, K] -> [O, K * C], tap-major like the unfolded input
            self._taps = [c.weight.detach().permute(0, 2, 1).reshape(c.out_channels, -1).contiguous()
                          for c in self.convs]
        k = conv.kernel_size[0]
        taps = F.pad(x, (k // 2, k // 2)).unfold(2, k, 1)  # [B, C, T, K]
        taps = taps.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1)  # [B, T, K * C]
        return torch.baddbmm(conv.bias[None, :, None], self._taps[i].expand(x.shape[0], -1, -1),
                             taps.transpose(1, 2))


class PerthNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedder = ConvStack(MARK_BINS)
        self.detectors = nn.ModuleList(ConvStack(2) for _ in DETECT_TIME_SCALES)

    @classmethod
    def random(cls, seed: int = 0) -> PerthNet:
        """The same network with seeded random weights (`--load-format dummy`)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls().eval()

    @classmethod
    def load(cls, path: Path | None = None) -> PerthNet:
        """The trained network (float32, CPU, eval), every tensor checked by name and shape."""
        path = path or find_checkpoint()
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)["model"]
        except (OSError, RuntimeError, KeyError, EOFError) as exc:
            raise WatermarkUnavailableError(f"the watermark model {path} cannot be read: {exc}") from exc
        net = cls()
        net.load_state_dict(_renamed(state, net), strict=True)
        return net.eval()

    def features(self, spec: torch.Tensor) -> torch.Tensor:
        """spec [B, F, T] complex STFT at 24 kHz -> [B, F, T] float32 normalized log-magnitude."""
        db = 20.0 * torch.log10((spec.abs() * TRAINED_RATE_SCALE).clamp_min(FLOOR))
        return (db - FLOOR_DB) / DB_SPAN

    def embed_gain(self, feats: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[B, F, T] features, [B, T] mask, [B, T] valid frames -> [B, 128, T] magnitude gain
        of the low bins (1 outside the mask)."""
        residual = self.embedder(feats[:, :MARK_BINS], valid) * mask[:, None]
        return torch.pow(10.0, residual * (DB_SPAN / 20.0))

    def detect(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, F, T] features, [B, T] mask -> [B] scores in [0, 1] (1: marked)."""
        low = feats[:, :MARK_BINS]
        frames = low.shape[-1]
        scores, attention = [], []
        for scale, stack in zip(DETECT_TIME_SCALES, self.detectors):
            x = low if scale == 1.0 else F.interpolate(low, size=int(frames * scale), mode="linear",
                                                       align_corners=True)
            out = stack(x)  # [B, 2, T']: (attention, score) per frame
            m = F.interpolate(mask[:, None], size=out.shape[-1], mode="nearest")  # [B, 1, T']
            pooled = (out * m).sum(-1) / m.sum(-1).clamp_min(1.0)  # [B, 2]
            attention.append(pooled[:, 0])
            scores.append(pooled[:, 1])
        weights = torch.softmax(torch.stack(attention, 1), dim=1)
        return (torch.stack(scores, 1) * weights).sum(1).clamp(0.0, 1.0)


def frame_mask(feats: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """[B, F, T] features -> [B, T] float mask of frames loud enough to carry the mark; with
    `valid` [B, T] (a padded batch) of the valid frames only, against the loudest valid frame
    (features are >= 0, so a zeroed frame never sets the threshold)."""
    energy = feats.sum(1)
    if valid is None:
        return (energy > energy.amax(-1, keepdim=True) * MASK_FRACTION).float()
    top = (energy * valid).amax(-1, keepdim=True)
    return (energy > top * MASK_FRACTION).float() * valid


def mark_change(net: PerthNet, hann: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The change that marks each row's window, as it is marked alone (perth/rows.py's note).
    rows [B, HOP·(T−1) + N_FFT] float32 and valid [B, T] float32 as `rows.fill_rows` lays
    them out -> [B, HOP·T] float32, each window's change at its span. Graph-safe: no host sync,
    shapes fixed by the inputs."""
    batch, frames = valid.shape
    spec = torch.stft(rows, N_FFT, HOP, window=hann, center=False, return_complex=True)  # [B, F, T]
    feats = net.features(spec)
    gain = net.embed_gain(feats, frame_mask(feats, valid), valid)  # [B, 128, T]
    low = (spec[:, :MARK_BINS] * (gain - 1.0)).transpose(1, 2)  # [B, T, 128]: the other bins do not change
    # the inverse STFT (irfft zero-fills the bins above 128), overlap-added and divided by the
    # window's own frames' squared-window sum, as torch.istft does for the window alone
    pieces = torch.fft.irfft(low, N_FFT, dim=-1) * hann  # [B, T, N_FFT]
    signal = torch.ops.aten.unfold_backward(pieces, [batch, row_samples(frames)], 1, N_FFT, HOP)
    weights = hann.pow(2) * valid[..., None]  # [B, T, N_FFT]; 0 for the padding's frames
    envelope = torch.ops.aten.unfold_backward(weights, [batch, row_samples(frames)], 1, N_FFT, HOP)
    span = slice(EDGE, EDGE + HOP * frames)
    # a window's samples are all under its own frames; the clamp only keeps padding finite
    return signal[:, span] / envelope[:, span].clamp_min(1e-11)


def _renamed(state: dict[str, torch.Tensor], net: PerthNet) -> dict[str, torch.Tensor]:
    """Checkpoint names -> ours (`encoder.layers.3.conv.weight` -> `embedder.convs.3.weight`);
    any name neither mapped nor known unused is an error, as is any missing one."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for name, tensor in state.items():
        if name in _UNUSED:
            continue
        prefix, _, rest = name.rpartition(".conv.")
        stack, _, index = prefix.rpartition(".")
        if stack not in _STACKS or not rest:
            unknown.append(name)
            continue
        out[f"{_STACKS[stack]}.convs.{index}.{rest}"] = tensor
    missing = sorted(set(net.state_dict()) - set(out))
    if unknown or missing:
        raise WatermarkUnavailableError(f"the watermark model does not match: unknown {unknown}, missing {missing}")
    return out


class PerthWatermarker:
    """PerTh on a 24 kHz STFT, on one torch device (audio/watermark.py's `Watermarker`).
    Thread-safe: calls are serialised by a lock (the engine's mark stage embeds, detection
    requests score). Windows are marked by `MarkRunner`: on a GPU in padded batches, as CUDA
    graphs once `prepare` captured them; on the CPU one at a time."""

    name = "perth"
    sample_rate_hz = SAMPLE_RATE_HZ
    # The left context one marked sample depends on: the STFT window either side of each of the
    # embedder's +-15 frames, rounded up to whole 10 ms frames (22 frames, 220 ms).
    context_samples = -(-(N_FFT + RECEPTIVE_HALF_FRAMES * HOP) // HOP) * HOP

    def __init__(self, net: PerthNet, device: torch.device):
        self.device = device
        self.net = net.to(device)
        self._window = torch.hann_window(N_FFT, periodic=True, device=device)
        self._lock = threading.Lock()
        # on a GPU, its own stream, as the codec's: the mark never queues behind Stage 0's or the
        # codec's kernels, nor they behind it (its host copies wait for this stream only)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.runner = MarkRunner(functools.partial(mark_change, self.net, self._window), device, self._stream)

    def _on_stream(self):
        return torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()

    @classmethod
    def load(cls, device: str | torch.device = "cpu", dummy: bool = False) -> PerthWatermarker:
        return cls(PerthNet.random() if dummy else PerthNet.load(), torch.device(device))

    def _stft(self, audio: torch.Tensor) -> torch.Tensor:
        """[..., n] float32 -> [..., F, T] complex (centred frames, reflected edges)."""
        return torch.stft(audio, N_FFT, HOP, window=self._window, center=True, pad_mode="reflect",
                          return_complex=True)

    def prepare(self, max_windows: int, max_chunk_samples: int) -> dict:
        """Capture the batches the engine's mark stage will run (up to `max_windows` windows of
        up to `context_samples + max_chunk_samples`): CUDA graphs on a GPU, nothing on the CPU."""
        with self._lock:
            return self.runner.capture(max_windows, self.context_samples + max_chunk_samples)

    def residuals(self, windows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each window [n_i] float32 -> [n_i] float32, the change marking it, whatever else is
        in the call (on a GPU windows of any lengths run in one padded batch: perth/rows.py)."""
        with self._lock:
            return self.runner.residuals(windows)

    @torch.inference_mode()
    def score(self, audio: np.ndarray) -> float:
        """[n] float32 at 24 kHz -> 0..1; 0 for a clip shorter than one STFT window."""
        if audio.size <= N_FFT:
            return 0.0
        with self._lock, self._on_stream():
            feats = self.net.features(self._stft(self._tensor(audio))[None])
            return float(self.net.detect(feats, frame_mask(feats))[0])

    def _tensor(self, audio: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).to(self.device)
