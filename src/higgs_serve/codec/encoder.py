"""Codec encoder (voice cloning): 24 kHz mono reference audio -> codes [T, 8] (docs/model.md#reference-encoder).

Same math as transformers' `HiggsAudioV2TokenizerModel.encode` (the numerical reference):
  semantic: resample 24k -> 16k (windowed sinc), zero-pad 160 samples each side, HuBERT-base with
            all hidden states (embedding output + every layer), their mean, every 2nd frame,
            then the semantic encoder (conv + ELU residual blocks);
  acoustic: DAC encoder (strides 8,5,4,2,3). If its output length would differ from the semantic
            length, the waveform is zero-padded by hop/2 = 480 each side first (reference quirk);
  join:     concat [acoustic, semantic] channels -> fc -> 8-layer residual VQ (project_in,
            nearest codeword by squared distance, subtract project_out of it).
Our addition: clips shorter than 1 s are zero-padded at the end to 1 s (as sglang-omni does),
so short references get trailing-silence codes instead of failing. Everything runs in the
module's dtype (float32 by default).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from higgs_serve.codec.codec_config import REQUIRED_SAMPLE_RATE, CodecConfig
from higgs_serve.codec.decoder import RESIDUAL_DILATIONS, residual_unit, snake
from higgs_serve.codec.resample import resample
from higgs_serve.codec.weights import FlatWeights, expected_encoder_tensors
from higgs_serve.errors import InvalidRequestError

SEMANTIC_PAD = 160  # samples at 16 kHz, each side, before HuBERT (reference value)
MIN_SECONDS = 1.0


class CodecEncoder(FlatWeights):
    """audio [n] float at 24 kHz -> codes [T, num_quantizers] int64 (T = frames of the padded clip)."""

    def __init__(self, cfg: CodecConfig):
        super().__init__(expected_encoder_tensors(cfg), "encoder")
        self.cfg = cfg

    @torch.no_grad()
    def encode(self, audio_24k: Tensor) -> Tensor:
        """audio_24k [n] float -> codes [T, num_quantizers] int64 on the module's device."""
        if audio_24k.ndim != 1 or audio_24k.numel() == 0:
            raise ValueError(f"reference audio must be a non-empty 1-D tensor, got shape {list(audio_24k.shape)}")
        w = self._w()
        ref = w["fc.weight"]
        x = audio_24k.to(device=ref.device, dtype=ref.dtype)
        min_len = int(MIN_SECONDS * self.cfg.sample_rate)
        if x.numel() < min_len:
            x = F.pad(x, (0, min_len - x.numel()))
        x = x[None, None, :]  # [1, 1, n]
        e_semantic = self._semantic_branch(x, w)  # [1, S, T]
        e_acoustic = self._acoustic_branch(x, w, e_semantic.shape[-1])  # [1, latent, T]
        # the two lengths are equal for every clip length (checked for 1-20 s); the min only guards a skew
        t = min(e_semantic.shape[-1], e_acoustic.shape[-1])
        emb = torch.cat([e_acoustic[..., :t], e_semantic[..., :t]], dim=1)  # [1, hidden, T]
        emb = F.linear(emb.transpose(1, 2), w["fc.weight"], w["fc.bias"])  # [1, T, hidden]
        return self._rvq_encode(emb[0], w)  # [T, Q]

    # ---- semantic branch ----
    def _semantic_branch(self, x: Tensor, w: dict[str, Tensor]) -> Tensor:
        cfg = self.cfg
        x16 = resample(x[:, 0, :], cfg.sample_rate, cfg.semantic_sample_rate)  # [1, m]
        x16 = F.pad(x16, (SEMANTIC_PAD, SEMANTIC_PAD))
        states = hubert_hidden_states(x16, w, cfg)  # L+1 x [1, F, S]
        feats = torch.stack(states, dim=1).mean(dim=1)  # [1, F, S]
        feats = feats[:, :: cfg.semantic_downsample_factor, :]
        return semantic_encoder(feats.transpose(1, 2), w, cfg)  # [1, S, T]

    # ---- acoustic branch ----
    def _acoustic_branch(self, x: Tensor, w: dict[str, Tensor], semantic_len: int) -> Tensor:
        if acoustic_output_length(x.shape[-1], self.cfg) != semantic_len:
            pad = self.cfg.hop_length // 2
            x = F.pad(x, (pad, pad))
        return acoustic_encoder(x, w, self.cfg)

    # ---- residual VQ ----
    def _rvq_encode(self, emb: Tensor, w: dict[str, Tensor]) -> Tensor:
        """emb [T, hidden] -> codes [T, Q]: per layer the nearest codeword of project_in(residual)."""
        residual = emb
        codes = []
        for q in range(self.cfg.num_quantizers):
            p = f"quantizer.quantizers.{q}."
            z = F.linear(residual, w[p + "project_in.weight"], w[p + "project_in.bias"])  # [T, D]
            embed = w[p + "codebook.embed"]  # [K, D]
            # same formula and op order as the reference: -(|z|² - 2 z·e + |e|²), argmax
            dist = -(z.pow(2).sum(1, keepdim=True) - 2 * z @ embed.t() + embed.t().pow(2).sum(0, keepdim=True))
            idx = dist.max(dim=-1).indices  # [T]
            quantized = F.linear(F.embedding(idx, embed), w[p + "project_out.weight"], w[p + "project_out.bias"])
            residual = residual - quantized
            codes.append(idx)
        return torch.stack(codes, dim=-1)  # [T, Q] int64


def _conv_len(length: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    return (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def acoustic_output_length(n: int, cfg: CodecConfig) -> int:
    """Frames the DAC encoder gives for n samples (only its strided convs change the length)."""
    length = _conv_len(n, 7, padding=3)
    for s in cfg.downsampling_ratios:
        length = _conv_len(length, 2 * s, stride=s, padding=math.ceil(s / 2))
    return _conv_len(length, 3, padding=1)


def acoustic_encoder(x: Tensor, w: dict[str, Tensor], cfg: CodecConfig) -> Tensor:
    """DAC encoder: x [B, 1, n] -> [B, latent_dim, frames]."""
    x = F.conv1d(x, w["acoustic_encoder.conv1.weight"], w["acoustic_encoder.conv1.bias"], padding=3)
    for i, s in enumerate(cfg.downsampling_ratios):
        p = f"acoustic_encoder.block.{i}"
        for u, d in enumerate(RESIDUAL_DILATIONS, start=1):
            x = residual_unit(x, w, f"{p}.res_unit{u}", d)
        x = snake(x, w[p + ".snake1.alpha"])
        x = F.conv1d(x, w[p + ".conv1.weight"], w[p + ".conv1.bias"], stride=s, padding=math.ceil(s / 2))
    x = snake(x, w["acoustic_encoder.snake1.alpha"])
    return F.conv1d(x, w["acoustic_encoder.conv2.weight"], w["acoustic_encoder.conv2.bias"], padding=1)


def semantic_encoder(x: Tensor, w: dict[str, Tensor], cfg: CodecConfig) -> Tensor:
    """Conv + blocks of ELU residual units and a conv: x [B, S, T] -> [B, S, T] (strides 1)."""
    x = F.conv1d(x, w["encoder_semantic.conv.weight"], padding=cfg.kernel_size // 2)
    for i, stride in enumerate(cfg.strides):
        p = f"encoder_semantic.conv_blocks.{i}"
        for j, d in enumerate(cfg.block_dilations):
            y = F.elu(x)
            y = F.conv1d(y, w[f"{p}.res_units.{j}.conv1.weight"], padding=((cfg.unit_kernel_size - 1) // 2) * d,
                         dilation=d)
            y = F.conv1d(F.elu(y), w[f"{p}.res_units.{j}.conv2.weight"])
            x = x + y
        k = 3 if stride == 1 else 2 * stride
        x = F.conv1d(x, w[p + ".conv.weight"], w[p + ".conv.bias"], stride=stride, padding=(k - 1) // 2)
    return x


def hubert_hidden_states(x: Tensor, w: dict[str, Tensor], cfg: CodecConfig) -> list[Tensor]:
    """HuBERT-base (group-norm feature extractor, post-norm layers), eval mode.

    x [B, samples] at 16 kHz -> [embedding output, layer 1 output, ..., layer L output], each [B, F, H].
    """
    s = cfg.semantic
    p = "semantic_model."
    h = x[:, None, :]  # [B, 1, samples]
    for i, stride in enumerate(s.conv_stride):
        cp = f"{p}feature_extractor.conv_layers.{i}."
        h = F.conv1d(h, w[cp + "conv.weight"], w.get(cp + "conv.bias"), stride=stride)
        if i == 0:  # GroupNorm with one group per channel
            h = F.group_norm(h, s.conv_dim[0], w[cp + "layer_norm.weight"], w[cp + "layer_norm.bias"])
        h = F.gelu(h)
    h = h.transpose(1, 2)  # [B, F, C]
    h = F.layer_norm(h, (s.conv_dim[-1],), w[p + "feature_projection.layer_norm.weight"],
                     w[p + "feature_projection.layer_norm.bias"], s.layer_norm_eps)
    h = F.linear(h, w[p + "feature_projection.projection.weight"], w[p + "feature_projection.projection.bias"])
    # positional conv embedding ("same" padding; an even kernel drops the last frame)
    pos = F.conv1d(h.transpose(1, 2), w[p + "encoder.pos_conv_embed.conv.weight"],
                   w[p + "encoder.pos_conv_embed.conv.bias"], padding=s.num_conv_pos_embeddings // 2,
                   groups=s.num_conv_pos_embedding_groups)
    if s.num_conv_pos_embeddings % 2 == 0:
        pos = pos[:, :, :-1]
    h = h + F.gelu(pos).transpose(1, 2)
    h = F.layer_norm(h, (s.hidden_size,), w[p + "encoder.layer_norm.weight"], w[p + "encoder.layer_norm.bias"],
                     s.layer_norm_eps)
    states = [h]
    for layer in range(s.num_hidden_layers):
        h = _hubert_layer(h, w, f"{p}encoder.layers.{layer}.", cfg)
        states.append(h)
    return states


def _hubert_layer(h: Tensor, w: dict[str, Tensor], lp: str, cfg: CodecConfig) -> Tensor:
    """Post-norm transformer layer: LN(h + attn(h)), then LN(h + ffn(h))."""
    s = cfg.semantic
    b, t, d = h.shape

    def heads(name: str) -> Tensor:  # [B, F, H] -> [B, heads, F, head_dim]
        y = F.linear(h, w[lp + f"attention.{name}.weight"], w[lp + f"attention.{name}.bias"])
        return y.view(b, t, s.num_attention_heads, s.head_dim).transpose(1, 2)

    attn = F.scaled_dot_product_attention(heads("q_proj"), heads("k_proj"), heads("v_proj"),
                                          scale=s.head_dim ** -0.5)
    attn = attn.transpose(1, 2).reshape(b, t, d)
    h = h + F.linear(attn, w[lp + "attention.out_proj.weight"], w[lp + "attention.out_proj.bias"])
    h = F.layer_norm(h, (d,), w[lp + "layer_norm.weight"], w[lp + "layer_norm.bias"], s.layer_norm_eps)
    ff = F.gelu(F.linear(h, w[lp + "feed_forward.intermediate_dense.weight"],
                         w[lp + "feed_forward.intermediate_dense.bias"]))
    h = h + F.linear(ff, w[lp + "feed_forward.output_dense.weight"], w[lp + "feed_forward.output_dense.bias"])
    return F.layer_norm(h, (d,), w[lp + "final_layer_norm.weight"], w[lp + "final_layer_norm.bias"], s.layer_norm_eps)


def prepare_reference_audio(samples: np.ndarray, sample_rate: int, target_rate: int = REQUIRED_SAMPLE_RATE) -> np.ndarray:
    """Any decoded audio -> float32 mono at `target_rate` (soxr high quality).

    samples: [n] or [n, channels] (soundfile layout); float, or int16/int32 PCM (scaled to [-1, 1]).
    Channels are mixed down by their mean.
    """
    import soxr  # the product's resampler for arbitrary input rates

    a = np.asarray(samples)
    if a.ndim not in (1, 2):
        raise InvalidRequestError(f"reference audio must be [samples] or [samples, channels], got shape {a.shape}")
    if np.issubdtype(a.dtype, np.integer):
        if a.dtype not in (np.int16, np.int32):
            raise InvalidRequestError(f"unsupported reference audio sample type {a.dtype}")
        a = a.astype(np.float32) / float(np.iinfo(a.dtype).max + 1)
    elif not np.issubdtype(a.dtype, np.floating):
        raise InvalidRequestError(f"unsupported reference audio sample type {a.dtype}")
    a = a.astype(np.float32, copy=False)
    if a.ndim == 2:
        a = a.mean(axis=1, dtype=np.float32)
    if a.size == 0:
        raise InvalidRequestError("reference audio is empty")
    if not np.all(np.isfinite(a)):
        raise InvalidRequestError("reference audio contains NaN or infinite samples")
    if sample_rate <= 0:
        raise InvalidRequestError(f"reference audio sample rate must be positive, got {sample_rate}")
    if sample_rate != target_rate:
        a = soxr.resample(a, sample_rate, target_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(a)
