"""The bundled codec's tensor layout: every expected name and shape, and the strict load check.

Names follow transformers' `HiggsAudioV2TokenizerModel.state_dict()` with the checkpoint prefix
`tied.embedding.modality_embeddings.0.model.` stripped (docs/model.md#checkpoint-layout), as they look AFTER weight-norm
folding (`model/checkpoint.py:fold_weight_norm`): every convolution has a plain `.weight`.
Verified against the real transformers model in tests/unit/test_codec_weights.py.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.errors import CheckpointError

CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."

# Training-only tensors a checkpoint may carry; they are accepted and dropped (docs/model.md#checkpoint-layout).
# `semantic_model.masked_spec_embed` is HuBERT's SpecAugment vector (transformers ignores it too).
IGNORED_CODEC_TENSOR_PATTERNS: tuple[str, ...] = (
    r"quantizer\.quantizers\.\d+\.codebook\.(embed_avg|cluster_size|inited)",
    r"decoder_semantic\..*",
    r"fc1\..*",
    r"semantic_model\.masked_spec_embed",
)
_IGNORED_RE = re.compile("|".join(f"(?:{p})" for p in IGNORED_CODEC_TENSOR_PATTERNS))

Shape = tuple[int, ...]


def is_ignored_codec_tensor(name: str) -> bool:
    """True for a (prefix-stripped) training-only codec tensor name."""
    return _IGNORED_RE.fullmatch(name) is not None


def expected_codec_tensors(cfg: CodecConfig) -> dict[str, Shape]:
    """Every tensor the codec needs (decoder and encoder sides), name -> shape."""
    return {**expected_decoder_tensors(cfg), **expected_encoder_tensors(cfg)}


def expected_decoder_tensors(cfg: CodecConfig) -> dict[str, Shape]:
    """Tensors `CodecDecoder` uses: codebooks, project_out, fc2, acoustic_decoder."""
    out = _quantizers(cfg, with_project_in=False)
    out["fc2.weight"] = (cfg.latent_dim, cfg.hidden_size)
    out["fc2.bias"] = (cfg.latent_dim,)
    out.update(_acoustic_decoder(cfg))
    return out


def expected_encoder_tensors(cfg: CodecConfig) -> dict[str, Shape]:
    """Tensors `CodecEncoder` uses: HuBERT, semantic encoder, DAC encoder, fc and the full RVQ."""
    out = _quantizers(cfg, with_project_in=True)
    out["fc.weight"] = (cfg.hidden_size, cfg.hidden_size)
    out["fc.bias"] = (cfg.hidden_size,)
    out.update(_acoustic_encoder(cfg))
    out.update(_semantic_encoder(cfg))
    out.update(_hubert(cfg))
    return out


def _quantizers(cfg: CodecConfig, with_project_in: bool) -> dict[str, Shape]:
    """The RVQ layers: codebooks and project_out decode; encoding also needs project_in."""
    out: dict[str, Shape] = {}
    for q in range(cfg.num_quantizers):
        p = f"quantizer.quantizers.{q}."
        out[p + "codebook.embed"] = (cfg.codebook_size, cfg.codebook_dim)
        if with_project_in:
            out[p + "project_in.weight"] = (cfg.codebook_dim, cfg.hidden_size)
            out[p + "project_in.bias"] = (cfg.codebook_dim,)
        out[p + "project_out.weight"] = (cfg.hidden_size, cfg.codebook_dim)
        out[p + "project_out.bias"] = (cfg.hidden_size,)
    return out


class FlatWeights(nn.Module):
    """A module whose parameters are stored flat under their checkpoint names ('.' -> '__' for
    nn.Module), shared by `CodecDecoder` and `CodecEncoder` (`part` names which, in errors)."""

    def __init__(self, shapes: dict[str, Shape], part: str):
        super().__init__()
        self._names = list(shapes)
        self._part = part
        self.weights = nn.ParameterDict(
            {n.replace(".", "__"): nn.Parameter(torch.zeros(s), requires_grad=False) for n, s in shapes.items()}
        )

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy this module's tensors from folded, prefix-stripped codec tensors (already checked by
        `load_codec_tensors`); names of the other side are ignored. Converts to the module dtype."""
        with torch.no_grad():
            for name in self._names:
                if name not in tensors:
                    raise KeyError(f"codec {self._part} tensor {name} missing")
                self.weights[name.replace(".", "__")].copy_(tensors[name])

    def _w(self) -> dict[str, torch.Tensor]:
        return {n: self.weights[n.replace(".", "__")] for n in self._names}


def _conv(out: dict[str, Shape], name: str, c_out: int, c_in: int, k: int, bias: bool = True) -> None:
    out[name + ".weight"] = (c_out, c_in, k)
    if bias:
        out[name + ".bias"] = (c_out,)


def _snake(out: dict[str, Shape], name: str, channels: int) -> None:
    out[name + ".alpha"] = (1, channels, 1)


def _dac_residual_units(out: dict[str, Shape], prefix: str, channels: int) -> None:
    for u in (1, 2, 3):  # dilations 1, 3, 9
        p = f"{prefix}.res_unit{u}"
        _snake(out, p + ".snake1", channels)
        _conv(out, p + ".conv1", channels, channels, 7)
        _snake(out, p + ".snake2", channels)
        _conv(out, p + ".conv2", channels, channels, 1)


def _acoustic_decoder(cfg: CodecConfig) -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    h = cfg.decoder_hidden_size
    _conv(out, "acoustic_decoder.conv1", h, cfg.latent_dim, 7)
    for i, s in enumerate(cfg.upsampling_ratios):
        c_in, c_out = h // 2**i, h // 2 ** (i + 1)
        p = f"acoustic_decoder.block.{i}"
        _snake(out, p + ".snake1", c_in)
        out[p + ".conv_t1.weight"] = (c_in, c_out, 2 * s)  # ConvTranspose1d: [in, out, k]
        out[p + ".conv_t1.bias"] = (c_out,)
        _dac_residual_units(out, p, c_out)
    final = h // 2 ** len(cfg.upsampling_ratios)
    _snake(out, "acoustic_decoder.snake1", final)
    _conv(out, "acoustic_decoder.conv2", 1, final, 7)
    return out


def _acoustic_encoder(cfg: CodecConfig) -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    h = cfg.encoder_hidden_size
    _conv(out, "acoustic_encoder.conv1", h, 1, 7)
    for i, s in enumerate(cfg.downsampling_ratios):
        dim = h * 2 ** (i + 1)  # channels double at every block
        p = f"acoustic_encoder.block.{i}"
        _dac_residual_units(out, p, dim // 2)
        _snake(out, p + ".snake1", dim // 2)
        _conv(out, p + ".conv1", dim, dim // 2, 2 * s)
    d_model = h * 2 ** len(cfg.downsampling_ratios)
    _snake(out, "acoustic_encoder.snake1", d_model)
    _conv(out, "acoustic_encoder.conv2", cfg.latent_dim, d_model, 3)
    return out


def _semantic_encoder(cfg: CodecConfig) -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    s_hidden = cfg.semantic.hidden_size
    _conv(out, "encoder_semantic.conv", s_hidden, s_hidden, cfg.kernel_size, bias=False)
    c_in = s_hidden
    for i, stride in enumerate(cfg.strides):
        c_out = int(s_hidden * cfg.channel_ratios[i])
        p = f"encoder_semantic.conv_blocks.{i}"
        for j in range(len(cfg.block_dilations)):
            _conv(out, f"{p}.res_units.{j}.conv1", c_in, c_in, cfg.unit_kernel_size, bias=False)
            _conv(out, f"{p}.res_units.{j}.conv2", c_in, c_in, 1, bias=False)
        _conv(out, p + ".conv", c_out, c_in, 3 if stride == 1 else 2 * stride)
        c_in = c_out
    return out


def _hubert(cfg: CodecConfig) -> dict[str, Shape]:
    s = cfg.semantic
    out: dict[str, Shape] = {}
    p = "semantic_model.feature_extractor.conv_layers"
    c_in = 1
    for i, (c_out, k) in enumerate(zip(s.conv_dim, s.conv_kernel)):
        _conv(out, f"{p}.{i}.conv", c_out, c_in, k, bias=s.conv_bias)
        if i == 0:  # feat_extract_norm "group": GroupNorm(c, c) on the first conv layer only
            out[f"{p}.0.layer_norm.weight"] = (c_out,)
            out[f"{p}.0.layer_norm.bias"] = (c_out,)
        c_in = c_out
    h = s.hidden_size
    out["semantic_model.feature_projection.layer_norm.weight"] = (s.conv_dim[-1],)
    out["semantic_model.feature_projection.layer_norm.bias"] = (s.conv_dim[-1],)
    out["semantic_model.feature_projection.projection.weight"] = (h, s.conv_dim[-1])
    out["semantic_model.feature_projection.projection.bias"] = (h,)
    _conv(out, "semantic_model.encoder.pos_conv_embed.conv", h, h // s.num_conv_pos_embedding_groups,
          s.num_conv_pos_embeddings)
    out["semantic_model.encoder.layer_norm.weight"] = (h,)
    out["semantic_model.encoder.layer_norm.bias"] = (h,)
    for layer in range(s.num_hidden_layers):
        lp = f"semantic_model.encoder.layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[lp + f"attention.{proj}.weight"] = (h, h)
            out[lp + f"attention.{proj}.bias"] = (h,)
        for norm in ("layer_norm", "final_layer_norm"):
            out[lp + norm + ".weight"] = (h,)
            out[lp + norm + ".bias"] = (h,)
        out[lp + "feed_forward.intermediate_dense.weight"] = (s.intermediate_size, h)
        out[lp + "feed_forward.intermediate_dense.bias"] = (s.intermediate_size,)
        out[lp + "feed_forward.output_dense.weight"] = (h, s.intermediate_size)
        out[lp + "feed_forward.output_dense.bias"] = (h,)
    return out


def load_codec_tensors(cfg: CodecConfig, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Strictly check folded, prefix-stripped codec tensors; return the required ones.

    Raises CheckpointError naming the full checkpoint name (with CODEC_PREFIX) and `where` for a
    missing required tensor, a wrong shape, or an unknown name. Training-only tensors are dropped.
    """
    expected = expected_codec_tensors(cfg)
    unknown = sorted(n for n in tensors if n not in expected and not is_ignored_codec_tensor(n))
    if unknown:
        shown = ", ".join(CODEC_PREFIX + n for n in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise CheckpointError(f"{where}: unexpected codec tensor {shown}{more}")
    missing = [n for n in expected if n not in tensors]
    if missing:
        shown = ", ".join(CODEC_PREFIX + n for n in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{where}: missing codec tensor {shown}{more}")
    for name, shape in expected.items():
        got = tuple(tensors[name].shape)
        if got != shape:
            raise CheckpointError(
                f"{where}: codec tensor {CODEC_PREFIX}{name} has shape {list(got)}, expected {list(shape)}"
            )
    return {name: tensors[name] for name in expected}
