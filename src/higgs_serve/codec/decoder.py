"""Codec decoder (Stage 1): codes [B, T, 8] -> audio [B, T·960] (docs/model.md#codec-geometry).

RVQ dequantise (Σ_q project_out_q(codebook_q[code_q])) -> fc2 (folded into one table lookup,
`_fold_input_table`) -> DAC decoder: conv1; per upsampling
stride s a block Snake -> ConvTranspose1d(k=2s, stride s, padding ceil(s/2), output_padding s%2) ->
three residual units (dilations 1, 3, 9); Snake; conv2; no tanh. Numerically the same as
transformers' `HiggsAudioV2TokenizerModel.decode`, written as plain functional torch; on CUDA the
Snakes are one fused Triton kernel each (`codec/snake.py`).

In float32 on CUDA the residual units' k7 convolutions of 256 channels and more run as one batched
SGEMM over the stacked taps (`conv7_gemm`, the same float32 arithmetic): cuDNN's float32 kernels
reach 19 TFLOP/s there against ~36 for the GEMM (benchmarks/results/conv_forms_h200.txt); below
256 channels cuDNN is the faster. Tried and dropped: the residual units' convolutions (~75 % of the
arithmetic) as a Triton implicit GEMM on the tensor cores with the "tf32x3" dot, which is as exact
as float32 (max error against float64 through the real-geometry decoder 8.2e-6 against cuDNN
float32's 8.6e-6) but slower: 64 windows of 39 frames took 86.3 ms against cuDNN's 61.1 ms in
float32, and 29.9 against 21.9 ms with one TF32 MMA (codec_conv_tf32x3_h200.json). What did pay:
the precision "bf16x3" (split_conv.py), with the operands split once where they are made (the
Snake, the weight load) instead of in the GEMM's registers: 29.0 ms against 40.5 for the same
64 windows in float32 (today's float32 path), ~1e-5 of peak.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.snake import SnakeFn, SplitSnakeFn, snake, snake_for, snake_split_for
from higgs_serve.codec.split_conv import SplitUnit, conv_split, taps
from higgs_serve.codec.weights import FlatWeights, expected_decoder_tensors

__all__ = ["RESIDUAL_DILATIONS", "CodecDecoder", "DecodeRange", "check_codes", "decode_range", "receptive_field_frames",
           "residual_unit", "snake"]

RESIDUAL_DILATIONS = (1, 3, 9)
RESIDUAL_REACH = sum(3 * d for d in RESIDUAL_DILATIONS)  # positions a block's three k7 units see each way
OUTER_KERNEL = 7  # conv1 and conv2
OUTER_HALF = OUTER_KERNEL // 2
GEMM_CONV_MIN_CHANNELS = 256  # from here up a k7 conv is faster as a GEMM in float32 on an H200
# "bf16x3" runs the residual units of this many channels and more split (the bench varies it;
# every unit of the real geometry pays on the H200: split_conv.py's forms per width).
SPLIT_CONV_MIN_CHANNELS = 0
# Stage 1 precisions (the deploy config's `stages[1].dtype`) -> the decoder's storage dtype.
# "tf32": convolutions on TF32 tensor cores; "bf16x3": the residual units' convolutions as split
# bf16 products summed in float32 (split_conv.py); both keep float32 weights and activations.
PRECISION_DTYPES = {"float32": torch.float32, "bf16x3": torch.float32, "tf32": torch.float32,
                    "bfloat16": torch.bfloat16, "float16": torch.float16}


def receptive_field_frames(cfg: CodecConfig) -> tuple[int, int]:
    """(left, right): how many frames before and after a frame can change its audio. 10 and 10
    for the Higgs v2 geometry: a streaming window's left context L past 10 frames
    (docs/model.md#receptive-field-and-seams) is decoded and cut without changing a sample, and a right holdback under 10 leaves a
    seam error.

    Walks the decoder backwards, from the samples of one output frame to the input frames they
    read: each k7 conv widens the range by 3·dilation per side, each ConvTranspose1d(k = 2s,
    stride s, padding p) maps output samples [a, b] to inputs [ceil((a + p − 2s + 1) / s),
    floor((b + p) / s)]. Every frame has the same answer (the strides tile a frame exactly).
    """
    half = OUTER_HALF
    first, last = -half, cfg.hop_length - 1 + half  # conv2, in output samples of frame 0
    for s in reversed(cfg.upsampling_ratios):
        first, last = first - RESIDUAL_REACH, last + RESIDUAL_REACH
        pad = math.ceil(s / 2)
        first, last = -((-(first + pad - 2 * s + 1)) // s), (last + pad) // s
    return half - first, last + half  # conv1, at the frame rate


@dataclass(frozen=True)
class DecodeRange:
    """Which positions each stage of the decoder computes so that output frames [keep) come out
    as a whole-window decode would give them. Every range is (start, end) in that stage's own
    positions (frames before conv1, samples at the stage's rate after), over the whole window."""

    frames: tuple[int, int]  # codes dequantised and convolved by conv1
    block_inputs: tuple[tuple[int, int], ...]  # each upsampling block's input positions
    conv2_input: tuple[int, int]  # samples fed to the final Snake and conv2
    keep: tuple[int, int]  # output samples returned


@functools.lru_cache(maxsize=256)
def decode_range(strides: tuple[int, ...], frames: int, keep_frames: tuple[int, int]) -> DecodeRange:
    """Walk back from output frames `keep_frames` of a `frames`-frame window to the positions
    every stage needs.

    Why it pays: a streaming window decodes left context and right holdback only to cut their
    audio (docs/model.md#streaming-windows), but the receptive field of a late stage spans a fraction of a frame, so
    the late stages (most of the arithmetic) need little more than the kept frames: a 39-frame
    window keeping 25 does ~27 % fewer multiply-adds, a 54-frame one ~47 %.

    Each stage runs on a slice with its own "same" zero padding. Where a slice edge is the
    window's edge that padding is the whole-window decode's own; elsewhere it corrupts a margin
    next to the edge, which the slice is widened to cover: 3 positions for a k7 conv,
    and for a block ConvTranspose1d(k = 2s, stride s, padding p) + residual units: an output t
    reads inputs floor((t + p) / s) - 1 and floor((t + p) / s), then the units spread by
    Σ 3·dilation = 39 positions. Results equal the whole-window decode's to float rounding.
    """
    hop = math.prod(strides)
    if not 0 <= keep_frames[0] < keep_frames[1] <= frames:
        raise ValueError(f"keep frames {keep_frames} must be a non-empty range within the {frames}-frame window")
    length = frames * hop
    keep = (keep_frames[0] * hop, keep_frames[1] * hop)
    conv2_input = (max(0, keep[0] - OUTER_HALF), min(length, keep[1] + OUTER_HALF))
    a, b = conv2_input
    block_inputs = []
    for s in reversed(strides):
        length //= s
        pad = math.ceil(s / 2)
        lo = max(0, (a + pad - RESIDUAL_REACH) // s - 1)
        hi = min(length, -(-(b + pad + RESIDUAL_REACH) // s))
        block_inputs.append((lo, hi))
        a, b = lo, hi
    first = (max(0, a - OUTER_HALF), min(frames, b + OUTER_HALF))
    return DecodeRange(first, tuple(reversed(block_inputs)), conv2_input, keep)


def _cut(x: Tensor, start: int, span: tuple[int, int]) -> Tensor:
    """Positions [span) of x [B, C, L] whose first position is `start` (a view; no copy when the
    span is all of x)."""
    return x[..., span[0] - start : span[1] - start]


def conv7_gemm(x: Tensor, weight: Tensor, bias: Tensor, dilation: int) -> Tensor:
    """F.conv1d(x, weight, bias, padding=3·dilation, dilation=dilation) for a k7 weight, as one
    batched GEMM: bias + W [C_out, C_in·7] @ taps [B, C_in·7, T]."""
    return torch.baddbmm(bias[None, :, None], weight.reshape(weight.shape[0], -1).expand(x.shape[0], -1, -1),
                         taps(x, dilation, weight.shape[-1]))


def residual_unit(x: Tensor, w: dict[str, Tensor], prefix: str, dilation: int, snake: SnakeFn = snake,
                  gemm: bool = False) -> Tensor:
    """DAC residual unit: x + conv1x1(snake(conv7_dilated(snake(x)))); length preserved. `gemm`:
    the k7 conv as `conv7_gemm`."""
    y = snake(x, w[prefix + ".snake1.alpha"])
    if gemm:
        y = conv7_gemm(y, w[prefix + ".conv1.weight"], w[prefix + ".conv1.bias"], dilation)
    else:
        y = F.conv1d(y, w[prefix + ".conv1.weight"], w[prefix + ".conv1.bias"], padding=3 * dilation, dilation=dilation)
    y = snake(y, w[prefix + ".snake2.alpha"])
    y = F.conv1d(y, w[prefix + ".conv2.weight"], w[prefix + ".conv2.bias"])
    return x + y


def split_residual_unit(x: Tensor, unit: SplitUnit, alpha1: Tensor, alpha2: Tensor, dilation: int,
                        snake_split: SplitSnakeFn) -> Tensor:
    """`residual_unit` in float32 with both convolutions as split bf16 GEMMs (split_conv.py): the
    k7 conv's bias is added by the second Snake, the k1 conv adds its own and the skip."""
    y = conv_split(snake_split(x, alpha1, None), unit.conv7, dilation)
    return conv_split(snake_split(y, alpha2, unit.bias7), unit.conv1, 1, unit.bias1, x)


def _fold_input_table(w: dict[str, Tensor], num_quantizers: int) -> Tensor:
    """[Q·codebook_size, fc2 out]: row q·codebook_size + c is code c of quantizer q carried
    through its project_out and fc2 (fc2's bias in quantizer 0's rows). The lookup, each
    project_out, their sum and fc2 are all linear, so the codes' part of the decoder input is a
    sum of fixed rows: an offset add, one lookup and one sum a window batch instead of eight
    lookups, eight GEMMs, seven adds and fc2 (24 launches, and their host work, on the eager
    codec path). Built in float64, returned in the weights' dtype: as exact as the unfolded
    float32 chain or more."""
    fc2_w, fc2_b = w["fc2.weight"].double(), w["fc2.bias"].double()
    tables = []
    for q in range(num_quantizers):
        p = f"quantizer.quantizers.{q}."
        z = F.linear(w[p + "codebook.embed"].double(), w[p + "project_out.weight"].double(),
                     w[p + "project_out.bias"].double())  # [codebook_size, hidden]
        tables.append(F.linear(z, fc2_w, fc2_b if q == 0 else None))
    return torch.cat(tables).to(fc2_w.device, w["fc2.weight"].dtype)


def check_codes(codes: Tensor, codebook_size: int) -> None:
    """Validate codes before decoding (one host sync: call it where a sync is acceptable).

    The caller must already have replaced special codes (BOC/EOC) by 0 (docs/model.md#delay-pattern): an
    out-of-range index would otherwise index past the codebook.
    """
    if codes.dtype != torch.int64:
        raise ValueError(f"codes must be int64, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= codebook_size):
        raise ValueError(
            f"codes must lie in [0, {codebook_size - 1}], got [{int(codes.min())}, {int(codes.max())}]; "
            "replace special codes by 0 before decoding"
        )


class CodecDecoder(FlatWeights):
    """codes [B, T, Q] int64 in [0, codebook_size) -> audio [B, T·hop] float (module dtype)."""

    def __init__(self, cfg: CodecConfig):
        super().__init__(expected_decoder_tensors(cfg), "decoder")
        self.cfg = cfg
        self.precision = "float32"  # see PRECISION_DTYPES; set by use_precision
        self.snake: SnakeFn = snake_for("cpu")
        self.snake_split: SplitSnakeFn = snake_split_for("cpu")
        # k7 convs of this many channels and more run as a GEMM (None: never); see the module doc
        self.gemm_conv_min_channels: int | None = None
        self.split_units: dict[str, SplitUnit] | None = None  # residual unit -> its split weights ("bf16x3")
        # "bf16x3" splits the units of this many channels and more (narrower ones: float32 convs)
        self.split_conv_min_channels = SPLIT_CONV_MIN_CHANNELS
        # [Q·codebook_size, fc2 out] and [Q]: see `_fold_input_table`. The table is built from the
        # weights at its first use and dropped by `_pick_forms` (every load, move and cast), so
        # start-up's construct, move, load and precision steps build it once, not four times.
        self._input_table: Tensor | None = None
        self._input_offsets: Tensor | None = None
        self._pick_forms()

    def use_precision(self, precision: str) -> CodecDecoder:
        """Decode at a Stage 1 precision (PRECISION_DTYPES); call it after the move to the
        codec's device and dtype. "tf32" also needs cuDNN's TF32 switch, which is process-wide
        (the engine builder sets it)."""
        if precision not in PRECISION_DTYPES:
            raise ValueError(f"codec precision must be one of {sorted(PRECISION_DTYPES)}, got {precision!r}")
        dtype = self.weights[next(iter(self.weights))].dtype
        if dtype != PRECISION_DTYPES[precision]:
            raise ValueError(f"codec precision {precision!r} needs {PRECISION_DTYPES[precision]} weights, "
                             f"the decoder holds {dtype}")
        self.precision = precision
        self._pick_forms()
        return self

    def load_state(self, tensors: dict[str, Tensor]) -> None:
        super().load_state(tensors)
        self._pick_forms()  # split weights are derived from the loaded ones

    def _apply(self, fn, recurse=True):
        """Every move or cast (.to, .cuda, .cpu, .half) comes through here: pick the Snake and
        the conv forms for the new device and dtype once, so forward never asks which device it
        runs on."""
        super()._apply(fn, recurse)
        self._pick_forms()
        return self

    def _pick_forms(self) -> None:
        """A TF32 codec turns the float32 GEMM form off (cuDNN's TF32 convs are the faster); a
        bf16x3 one replaces it by the split form."""
        some = self.weights[next(iter(self.weights))]
        self.snake = snake_for(some.device, some.dtype)
        self.snake_split = snake_split_for(some.device)
        wide = some.device.type == "cuda" and some.dtype == torch.float32 and self.precision == "float32"
        self.gemm_conv_min_channels = GEMM_CONV_MIN_CHANNELS if wide else None
        split = self.precision == "bf16x3" and some.dtype == torch.float32
        self.split_units = self._split_units() if split else None
        self._input_table = None
        self._input_offsets = torch.arange(self.cfg.num_quantizers, device=some.device) * self.cfg.codebook_size

    def _split_units(self) -> dict[str, SplitUnit]:
        w = self._w()
        return {f"acoustic_decoder.block.{i}.res_unit{u}": SplitUnit.of(w, f"acoustic_decoder.block.{i}.res_unit{u}")
                for i in range(len(self.cfg.upsampling_ratios)) for u in range(1, len(RESIDUAL_DILATIONS) + 1)}

    def _gemm(self, channels: int) -> bool:
        return self.gemm_conv_min_channels is not None and channels >= self.gemm_conv_min_channels

    def _residual_unit(self, x: Tensor, w: dict[str, Tensor], prefix: str, dilation: int) -> Tensor:
        if self.split_units is not None and x.shape[1] >= self.split_conv_min_channels:
            return split_residual_unit(x, self.split_units[prefix], w[prefix + ".snake1.alpha"],
                                       w[prefix + ".snake2.alpha"], dilation, self.snake_split)
        return residual_unit(x, w, prefix, dilation, self.snake, self._gemm(x.shape[1]))

    def codes_to_input(self, codes: Tensor) -> Tensor:
        """codes [B, T, Q] -> the acoustic decoder's input [B, T, fc2 out]: fc2 of the RVQ sum
        Σ_q project_out_q(codebook_q[code_q]), as one lookup of `_input_table`."""
        table = self._input_table
        if table is None:
            table = self._input_table = _fold_input_table(self._w(), self.cfg.num_quantizers)
        # a gather and a sum (embedding_bag would be one launch, but these two are known to
        # capture in the codec's CUDA graphs)
        return F.embedding(codes + self._input_offsets, table).sum(dim=2)

    @torch.no_grad()
    def forward(self, codes: Tensor, keep: tuple[int, int] | None = None) -> Tensor:
        """codes [B, T, Q] int64 -> audio [B, T·hop], or with `keep` = (first, end) frames only
        the audio of those frames, [B, (end − first)·hop], computing no more of the window than
        they need (`decode_range`). Codes must be in range (see `check_codes`); no per-call host
        sync is done here so this stays graph-capturable."""
        if codes.ndim != 3 or codes.shape[-1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [B, T, {self.cfg.num_quantizers}], got {list(codes.shape)}")
        frames = codes.shape[1]
        plan = decode_range(tuple(self.cfg.upsampling_ratios), frames, keep or (0, frames))
        w, snake = self._w(), self.snake
        codes = codes[:, plan.frames[0] : plan.frames[1]]
        x = self.codes_to_input(codes.to(w["fc2.weight"].device)).transpose(1, 2)  # [B, latent_dim, T']
        x = F.conv1d(x, w["acoustic_decoder.conv1.weight"], w["acoustic_decoder.conv1.bias"], padding=OUTER_HALF)
        start = plan.frames[0]
        for i, (s, span) in enumerate(zip(self.cfg.upsampling_ratios, plan.block_inputs)):
            p = f"acoustic_decoder.block.{i}"
            x = snake(_cut(x, start, span), w[p + ".snake1.alpha"])
            # length: (L-1)·s - 2·ceil(s/2) + 2s + s%2 = L·s exactly
            x = F.conv_transpose1d(x, w[p + ".conv_t1.weight"], w[p + ".conv_t1.bias"], stride=s,
                                   padding=math.ceil(s / 2), output_padding=s % 2)
            start = span[0] * s
            for u, d in enumerate(RESIDUAL_DILATIONS, start=1):
                x = self._residual_unit(x, w, f"{p}.res_unit{u}", d)
        x = snake(_cut(x, start, plan.conv2_input), w["acoustic_decoder.snake1.alpha"])
        x = F.conv1d(x, w["acoustic_decoder.conv2.weight"], w["acoustic_decoder.conv2.bias"], padding=OUTER_HALF)
        return _cut(x, plan.conv2_input[0], plan.keep)[:, 0, :]  # no tanh (Higgs removes it)
