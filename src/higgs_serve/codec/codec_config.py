"""`CodecConfig`: the geometry of the bundled Higgs v2 audio tokenizer (codec, Stage 1).

The checkpoint's config.json may carry `audio_tokenizer_config`, a transformers
`HiggsAudioV2TokenizerConfig` dict (our extension for small test checkpoints). When it is absent,
or when a field is absent from it, the Higgs v2 tokenizer geometry below is used (docs/model.md#config-keys).

Note on defaults: transformers' own `HiggsAudioV2TokenizerConfig` defaults differ from the shipped
Higgs v2 tokenizer (it uses `downsampling_ratios=[8, 5, 4, 2]` and `target_bandwidths` ending in 4,
which give hop 320 and 16 quantizers). We merge over the *Higgs v2* values, so a partial dict means
the real geometry; `to_hf_dict` always writes every field, so transformers and we agree on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from higgs_serve.config.validators import is_int, is_real
from higgs_serve.errors import ConfigError

# The rest of the system assumes these (architecture.md "Shared constants"): 960 samples per
# frame at 24 kHz, i.e. 25 frames per second.
REQUIRED_SAMPLE_RATE = 24000
REQUIRED_HOP_LENGTH = 960


@dataclass(frozen=True)
class SemanticModelConfig:
    """The HuBERT-base semantic teacher (transformers `HubertConfig` fields we use)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    feat_extract_norm: str = "group"  # GroupNorm on conv layer 0 only (hubert-base)
    feat_extract_activation: str = "gelu"
    conv_dim: tuple[int, ...] = (512,) * 7
    conv_stride: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)  # product 320 samples per frame at 16 kHz
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_bias: bool = False
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    conv_pos_batch_norm: bool = False
    do_stable_layer_norm: bool = False  # post-norm transformer layers (hubert-base)
    feat_proj_layer_norm: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def conv_total_stride(self) -> int:
        return math.prod(self.conv_stride)

    @property
    def num_hidden_states(self) -> int:
        """Hidden states HuBERT returns with output_hidden_states: the embedding output + one per layer."""
        return self.num_hidden_layers + 1


@dataclass(frozen=True)
class CodecConfig:
    """Everything the codec decoder and encoder need. Units: samples, channels, Hz."""

    sample_rate: int = 24000
    semantic_sample_rate: int = 16000
    downsample_factor: int = 320  # HuBERT samples per semantic frame at semantic_sample_rate
    target_bandwidths: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0)  # kbps; the last one sets num_quantizers
    codebook_size: int = 1024
    codebook_dim: int = 64
    # DAC acoustic model (transformers DacConfig fields)
    encoder_hidden_size: int = 64
    downsampling_ratios: tuple[int, ...] = (8, 5, 4, 2, 3)
    decoder_hidden_size: int = 1024
    upsampling_ratios: tuple[int, ...] = (8, 5, 4, 2, 3)
    latent_dim: int = 256  # DacConfig.hidden_size: acoustic latent channels
    # semantic encoder (top-level HiggsAudioV2TokenizerConfig fields)
    kernel_size: int = 3
    channel_ratios: tuple[int, ...] = (1, 1)
    strides: tuple[int, ...] = (1, 1)
    block_dilations: tuple[int, ...] = (1, 1)
    unit_kernel_size: int = 3
    semantic: SemanticModelConfig = field(default_factory=SemanticModelConfig)

    # ---- derived geometry (same formulas as transformers' config properties) ----
    @property
    def hop_length(self) -> int:
        return math.prod(self.downsampling_ratios)

    @property
    def frame_rate(self) -> int:
        return math.ceil(self.sample_rate / self.hop_length)

    @property
    def codebook_nbits(self) -> int:
        return math.ceil(math.log2(self.codebook_size))

    @property
    def num_quantizers(self) -> int:
        return int(1000 * self.target_bandwidths[-1] // (self.frame_rate * self.codebook_nbits))

    @property
    def hidden_size(self) -> int:
        """RVQ width: acoustic latent + semantic channels (1024 for Higgs v2)."""
        return self.latent_dim + self.semantic.hidden_size

    @property
    def semantic_downsample_factor(self) -> int:
        """Keep every n-th HuBERT frame so the semantic rate equals the frame rate (2 for Higgs v2)."""
        return int(self.hop_length / (self.sample_rate / self.semantic_sample_rate) / self.downsample_factor)

    # ---- constructors ----
    @classmethod
    def tiny(cls) -> CodecConfig:
        """A small geometry that decodes fast on CPU but keeps hop 960, 25 fps and 8 quantizers."""
        return cls(
            codebook_dim=8,
            encoder_hidden_size=4,
            decoder_hidden_size=64,
            latent_dim=16,
            semantic=SemanticModelConfig(
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                conv_dim=(8,) * 7,
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
            ),
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any] | None, where: str) -> CodecConfig:
        """Parse a `HiggsAudioV2TokenizerConfig` dict merged over the Higgs v2 defaults.

        `where` names the source (e.g. "/models/x/config.json: audio_tokenizer_config") for errors.
        Keys we do not use (model_type, dropout rates, DAC quantizer fields, ...) are ignored.
        """
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: audio_tokenizer_config must be an object, got {type(d).__name__}")
        acoustic = _sub_dict(d, "acoustic_model_config", where)
        semantic = _sub_dict(d, "semantic_model_config", where)
        base = cls()
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("semantic", "encoder_hidden_size", "downsampling_ratios", "decoder_hidden_size",
                          "upsampling_ratios", "latent_dim"):
                continue
            if f.name in d and d[f.name] is not None:
                kw[f.name] = _coerce(d[f.name], getattr(base, f.name), f.name, where)
        for ours, theirs in _ACOUSTIC_KEYS.items():
            if theirs in acoustic and acoustic[theirs] is not None:
                kw[ours] = _coerce(acoustic[theirs], getattr(base, ours), f"acoustic_model_config.{theirs}", where)
        sem_base = SemanticModelConfig()
        sem_kw: dict[str, Any] = {}
        for f in fields(SemanticModelConfig):
            if f.name in semantic and semantic[f.name] is not None:
                sem_kw[f.name] = _coerce(semantic[f.name], getattr(sem_base, f.name),
                                         f"semantic_model_config.{f.name}", where)
        cfg = replace(base, **kw, semantic=replace(sem_base, **sem_kw))
        cfg.validate(where)
        return cfg

    def to_hf_dict(self) -> dict[str, Any]:
        """A dict `HiggsAudioV2TokenizerConfig(**d)` accepts; every field explicit (see module doc)."""
        s = self.semantic
        return {
            "target_bandwidths": list(self.target_bandwidths),
            "sample_rate": self.sample_rate,
            "kernel_size": self.kernel_size,
            "channel_ratios": list(self.channel_ratios),
            "strides": list(self.strides),
            "block_dilations": list(self.block_dilations),
            "unit_kernel_size": self.unit_kernel_size,
            "codebook_size": self.codebook_size,
            "codebook_dim": self.codebook_dim,
            "semantic_sample_rate": self.semantic_sample_rate,
            "downsample_factor": self.downsample_factor,
            "acoustic_model_config": {
                "model_type": "dac",
                "encoder_hidden_size": self.encoder_hidden_size,
                "downsampling_ratios": list(self.downsampling_ratios),
                "decoder_hidden_size": self.decoder_hidden_size,
                "upsampling_ratios": list(self.upsampling_ratios),
                "hidden_size": self.latent_dim,
            },
            "semantic_model_config": {
                "model_type": "hubert",
                "hidden_size": s.hidden_size,
                "num_hidden_layers": s.num_hidden_layers,
                "num_attention_heads": s.num_attention_heads,
                "intermediate_size": s.intermediate_size,
                "hidden_act": s.hidden_act,
                "layer_norm_eps": s.layer_norm_eps,
                "feat_extract_norm": s.feat_extract_norm,
                "feat_extract_activation": s.feat_extract_activation,
                "conv_dim": list(s.conv_dim),
                "conv_stride": list(s.conv_stride),
                "conv_kernel": list(s.conv_kernel),
                "conv_bias": s.conv_bias,
                "num_conv_pos_embeddings": s.num_conv_pos_embeddings,
                "num_conv_pos_embedding_groups": s.num_conv_pos_embedding_groups,
                "conv_pos_batch_norm": s.conv_pos_batch_norm,
                "do_stable_layer_norm": s.do_stable_layer_norm,
                "feat_proj_layer_norm": s.feat_proj_layer_norm,
                "mask_time_prob": 0.0,  # no masked_spec_embed parameter: inference only
            },
        }

    # ---- validation ----
    def validate(self, where: str) -> None:
        """Raise ConfigError naming the key for anything the codec math cannot run with."""
        s = self.semantic
        for name in ("sample_rate", "semantic_sample_rate", "downsample_factor", "codebook_size", "codebook_dim",
                     "encoder_hidden_size", "decoder_hidden_size", "latent_dim", "kernel_size", "unit_kernel_size"):
            _positive(getattr(self, name), name, where)
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "num_conv_pos_embeddings", "num_conv_pos_embedding_groups"):
            _positive(getattr(s, name), f"semantic_model_config.{name}", where)
        for name in ("downsampling_ratios", "upsampling_ratios", "strides", "block_dilations"):
            _positive_tuple(getattr(self, name), name, where)
        for name in ("conv_dim", "conv_stride", "conv_kernel"):
            _positive_tuple(getattr(s, name), f"semantic_model_config.{name}", where)
        if not self.target_bandwidths or any(b <= 0 for b in self.target_bandwidths):
            _fail("target_bandwidths", self.target_bandwidths, "must be a non-empty list of positive kbps", where)
        if self.sample_rate != REQUIRED_SAMPLE_RATE:
            _fail("sample_rate", self.sample_rate, f"must be {REQUIRED_SAMPLE_RATE}", where)
        if self.hop_length != REQUIRED_HOP_LENGTH:
            _fail("acoustic_model_config.downsampling_ratios", list(self.downsampling_ratios),
                  f"product must be {REQUIRED_HOP_LENGTH} samples per frame", where)
        if math.prod(self.upsampling_ratios) != self.hop_length:
            _fail("acoustic_model_config.upsampling_ratios", list(self.upsampling_ratios),
                  f"product must equal the hop length {self.hop_length}", where)
        if self.decoder_hidden_size % (2 ** len(self.upsampling_ratios)) != 0:
            _fail("acoustic_model_config.decoder_hidden_size", self.decoder_hidden_size,
                  f"must be divisible by 2**{len(self.upsampling_ratios)}", where)
        if self.num_quantizers < 1:
            _fail("target_bandwidths", list(self.target_bandwidths), "gives zero quantizers", where)
        if 2 ** self.codebook_nbits != self.codebook_size:
            _fail("codebook_size", self.codebook_size, "must be a power of two", where)
        if len(self.strides) != len(self.channel_ratios) or not self.strides:
            _fail("strides", list(self.strides), "must be non-empty and as long as channel_ratios", where)
        if int(s.hidden_size * self.channel_ratios[-1]) != s.hidden_size:
            _fail("channel_ratios", list(self.channel_ratios),
                  "last ratio must keep the semantic width (the fc input is acoustic + semantic)", where)
        sem_frames_per_hop = self.hop_length * self.semantic_sample_rate
        if sem_frames_per_hop % (self.sample_rate * self.downsample_factor) != 0 or self.semantic_downsample_factor < 1:
            _fail("downsample_factor", self.downsample_factor,
                  "the semantic frame rate must be an integer multiple of the codec frame rate", where)
        if s.conv_total_stride != self.downsample_factor:
            _fail("semantic_model_config.conv_stride", list(s.conv_stride),
                  f"product must equal downsample_factor {self.downsample_factor}", where)
        if not (len(s.conv_dim) == len(s.conv_stride) == len(s.conv_kernel)):
            _fail("semantic_model_config.conv_dim", list(s.conv_dim), "conv_dim/conv_stride/conv_kernel lengths differ",
                  where)
        if s.hidden_size % s.num_attention_heads != 0:
            _fail("semantic_model_config.num_attention_heads", s.num_attention_heads,
                  f"must divide hidden_size {s.hidden_size}", where)
        if s.hidden_size % s.num_conv_pos_embedding_groups != 0:
            _fail("semantic_model_config.num_conv_pos_embedding_groups", s.num_conv_pos_embedding_groups,
                  f"must divide hidden_size {s.hidden_size}", where)
        # Variants of HuBERT the codec math does not implement: fail loudly instead of computing garbage.
        for name, value, wanted in (("feat_extract_norm", s.feat_extract_norm, "group"),
                                    ("hidden_act", s.hidden_act, "gelu"),
                                    ("feat_extract_activation", s.feat_extract_activation, "gelu"),
                                    ("do_stable_layer_norm", s.do_stable_layer_norm, False),
                                    ("conv_pos_batch_norm", s.conv_pos_batch_norm, False),
                                    ("feat_proj_layer_norm", s.feat_proj_layer_norm, True)):
            if value != wanted:
                _fail(f"semantic_model_config.{name}", value, f"only {wanted!r} is supported (hubert-base)", where)


# our field name -> DacConfig key inside acoustic_model_config
_ACOUSTIC_KEYS = {
    "encoder_hidden_size": "encoder_hidden_size",
    "downsampling_ratios": "downsampling_ratios",
    "decoder_hidden_size": "decoder_hidden_size",
    "upsampling_ratios": "upsampling_ratios",
    "latent_dim": "hidden_size",
}


def _sub_dict(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    sub = d.get(key)
    if sub is None:
        return {}
    if not isinstance(sub, dict):
        raise ConfigError(f"{where}: {key} must be an object, got {type(sub).__name__}")
    return sub


def _coerce(value: Any, default: Any, key: str, where: str) -> Any:
    """Convert a JSON value to the type of our default, or raise ConfigError naming the key."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            _fail(key, value, "must be true or false", where)
        return value
    if isinstance(default, int):
        if not is_int(value):
            _fail(key, value, "must be an integer", where)
        return value
    if isinstance(default, float):
        if not is_real(value):
            _fail(key, value, "must be a number", where)
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            _fail(key, value, "must be a string", where)
        return value
    if isinstance(default, tuple):
        if not isinstance(value, (list, tuple)):
            _fail(key, value, "must be a list", where)
        elem = default[0] if default else 0
        return tuple(_coerce(v, elem, key, where) for v in value)
    raise AssertionError(f"unhandled default type for {key}")


def _positive(value: int, key: str, where: str) -> None:
    if value <= 0:
        _fail(key, value, "must be positive", where)


def _positive_tuple(value: tuple[int, ...], key: str, where: str) -> None:
    if not value or any(v <= 0 for v in value):
        _fail(key, list(value), "must be a non-empty list of positive integers", where)


def _fail(key: str, value: Any, why: str, where: str) -> None:
    raise ConfigError(f"{where}: audio_tokenizer_config.{key} = {value!r} {why}")
