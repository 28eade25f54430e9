"""config.json -> frozen `ModelSpec` (`TextConfig`, `AudioConfig`, `CodecConfig`).

No tokenizer I/O and no side effects: the spec is parsed and validated once, then frozen.
Every error is a `ConfigError` that names the key and the file (docs/model.md#config-keys).

Missing optional Qwen3 keys take the transformers `Qwen3Config` defaults (that is what the
reference engines do when they build the text config from a partial dict), except `rope_theta`:
missing or null means 1,000,000, because the transformers default of 10,000 is wrong for Qwen3.
The five geometry keys (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
vocab_size) are required: a config without them is broken, not partial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.config.validators import is_int, is_real
from higgs_serve.errors import ConfigError

MODEL_TYPE = "higgs_multimodal_qwen3"
ARCHITECTURE = "HiggsMultimodalQwen3ForConditionalGeneration"
QWEN3_DEFAULT_ROPE_THETA = 1_000_000.0
_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class TextConfig:
    """The Qwen3 backbone geometry (config.json `text_config`)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = QWEN3_DEFAULT_ROPE_THETA
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def preset_4b(cls) -> TextConfig:
        """Higgs-Audio V3 4B (Qwen3-4B geometry, docs/model.md#config-keys).

        max_position_embeddings is Qwen3-4B's 40960; the model was trained with 8192-token
        contexts, which is a serving limit (deploy `max_model_len`), not a config value.
        """
        return cls(hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                   intermediate_size=9728, vocab_size=151936, rms_norm_eps=1e-6,
                   rope_theta=QWEN3_DEFAULT_ROPE_THETA, max_position_embeddings=40960,
                   tie_word_embeddings=True)

    @classmethod
    def preset_tiny(cls, vocab_size: int) -> TextConfig:
        """A tiny Qwen3 for tests: a talker step takes milliseconds on 2 CPU cores."""
        return cls(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                   intermediate_size=128, vocab_size=vocab_size, rms_norm_eps=1e-6,
                   rope_theta=QWEN3_DEFAULT_ROPE_THETA, max_position_embeddings=8192,
                   tie_word_embeddings=False)


def boc_id(codebook_size: int) -> int:
    """Begin-of-codes id: the second-to-last entry of each codebook's vocabulary."""
    return codebook_size - 2


def eoc_id(codebook_size: int) -> int:
    """End-of-codes id: the last entry of each codebook's vocabulary."""
    return codebook_size - 1


@dataclass(frozen=True)
class AudioConfig:
    """The discrete audio modality (config.json `audio_encoder_config`)."""

    num_codebooks: int = 8
    codebook_size: int = 1026  # per codebook vocabulary: 1024 real codes + BOC + EOC
    tie_word_embeddings: bool = True
    out_dim: int | None = None  # None: the text hidden size

    @property
    def boc(self) -> int:
        return boc_id(self.codebook_size)

    @property
    def eoc(self) -> int:
        return eoc_id(self.codebook_size)

    @property
    def num_real_codes(self) -> int:
        return self.codebook_size - 2

    @property
    def table_rows(self) -> int:
        """Rows of the fused audio table W_a: [num_codebooks * codebook_size, D]."""
        return self.num_codebooks * self.codebook_size


@dataclass(frozen=True)
class ModelSpec:
    text: TextConfig
    audio: AudioConfig
    codec: CodecConfig = field(default_factory=CodecConfig)
    model_type: str = MODEL_TYPE
    architectures: tuple[str, ...] = (ARCHITECTURE,)
    torch_dtype: str = "bfloat16"

    @property
    def audio_dim(self) -> int:
        return self.audio.out_dim if self.audio.out_dim is not None else self.text.hidden_size


# ---------------------------------------------------------------------------------------------
# parsing


def load_model_spec(model_dir: Path) -> ModelSpec:
    """Read `model_dir/config.json` and return the validated spec."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: config.json not found")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from e
    return parse_model_spec(d, str(path))


def parse_model_spec(d: dict[str, Any], where: str) -> ModelSpec:
    """Parse a config.json dict; `where` names the file in error messages."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: the top level must be an object, got {type(d).__name__}")
    model_type = _get(d, "model_type", str, where, default=MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise ConfigError(f"{where}: model_type = {model_type!r}, expected {MODEL_TYPE!r}")
    archs = _get(d, "architectures", list, where, default=[ARCHITECTURE])
    if not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{where}: architectures must be a list of strings, got {archs!r}")
    dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"  # transformers 5 writes `dtype`
    if dtype not in _DTYPES:
        raise ConfigError(f"{where}: torch_dtype = {dtype!r}, expected one of {list(_DTYPES)}")
    text = _parse_text(_get(d, "text_config", dict, where), where)
    audio = _parse_audio(_get(d, "audio_encoder_config", dict, where, default={}), where)
    codec = CodecConfig.from_hf_dict(d.get("audio_tokenizer_config"), f"{where}: audio_tokenizer_config")
    spec = ModelSpec(text=text, audio=audio, codec=codec, model_type=model_type,
                     architectures=tuple(archs), torch_dtype=dtype)
    _check_cross(spec, where)
    return spec


def _parse_text(t: dict[str, Any], where: str) -> TextConfig:
    w = f"{where}: text_config"
    mt = t.get("model_type", "qwen3")
    if mt != "qwen3":
        raise ConfigError(f"{w}.model_type = {mt!r}, only 'qwen3' is supported")
    hidden = _get(t, "hidden_size", int, w)
    heads = _get(t, "num_attention_heads", int, w)
    cfg = TextConfig(
        hidden_size=hidden,
        num_layers=_get(t, "num_hidden_layers", int, w),
        num_heads=heads,
        num_kv_heads=_get(t, "num_key_value_heads", int, w, default=heads),
        head_dim=_get(t, "head_dim", int, w, default=128),
        intermediate_size=_get(t, "intermediate_size", int, w),
        vocab_size=_get(t, "vocab_size", int, w),
        rms_norm_eps=_get(t, "rms_norm_eps", float, w, default=1e-6),
        rope_theta=_rope_theta(t, w),
        max_position_embeddings=_get(t, "max_position_embeddings", int, w, default=32768),
        tie_word_embeddings=_get(t, "tie_word_embeddings", bool, w, default=False),
    )
    for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                "vocab_size", "max_position_embeddings"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"{w}.{_TEXT_KEYS.get(key, key)} = {getattr(cfg, key)} must be positive")
    if not cfg.rms_norm_eps > 0:
        raise ConfigError(f"{w}.rms_norm_eps = {cfg.rms_norm_eps} must be positive")
    if cfg.num_heads % cfg.num_kv_heads != 0:
        raise ConfigError(f"{w}.num_key_value_heads = {cfg.num_kv_heads} must divide "
                          f"num_attention_heads = {cfg.num_heads}")
    if cfg.head_dim % 2 != 0:
        raise ConfigError(f"{w}.head_dim = {cfg.head_dim} must be even (RoPE rotates pairs)")
    # Variants our Qwen3 math does not implement: fail loudly rather than compute something else.
    for key, wanted in (("hidden_act", "silu"), ("attention_bias", False), ("use_sliding_window", False)):
        if key in t and t[key] is not None and t[key] != wanted:
            raise ConfigError(f"{w}.{key} = {t[key]!r}, only {wanted!r} is supported")
    return cfg


_TEXT_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
              "num_kv_heads": "num_key_value_heads"}


def _rope_theta(t: dict[str, Any], w: str) -> float:
    """rope_theta from `rope_theta` or transformers 5's `rope_parameters`; missing/null -> 1e6."""
    params = t.get("rope_parameters")
    scaling = t.get("rope_scaling")
    for key, p in (("rope_parameters", params), ("rope_scaling", scaling)):
        if p is None:
            continue
        if not isinstance(p, dict):
            raise ConfigError(f"{w}.{key} must be an object or null, got {type(p).__name__}")
        rtype = p.get("rope_type", p.get("type", "default"))
        if rtype not in ("default", None):
            raise ConfigError(f"{w}.{key}.rope_type = {rtype!r}, only 'default' RoPE is supported")
    theta = t.get("rope_theta")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    if theta is None:
        return QWEN3_DEFAULT_ROPE_THETA
    if not is_real(theta) or theta <= 0:
        raise ConfigError(f"{w}.rope_theta = {theta!r} must be a positive number")
    return float(theta)


def _parse_audio(a: dict[str, Any], where: str) -> AudioConfig:
    w = f"{where}: audio_encoder_config"
    enc = _get(a, "encoder_type", str, w, default="discrete")
    if enc != "discrete":
        raise ConfigError(f"{w}.encoder_type = {enc!r}, only 'discrete' is supported")
    cfg = AudioConfig(
        num_codebooks=_get(a, "num_codebooks", int, w, default=AudioConfig.num_codebooks),
        codebook_size=_get(a, "vocab_size", int, w, default=AudioConfig.codebook_size),
        tie_word_embeddings=_get(a, "tie_word_embeddings", bool, w, default=True),
        out_dim=_get(a, "out_dim", int, w, default=None),
    )
    if cfg.num_codebooks <= 0:
        raise ConfigError(f"{w}.num_codebooks = {cfg.num_codebooks} must be positive")
    if cfg.codebook_size <= 2:
        raise ConfigError(f"{w}.vocab_size = {cfg.codebook_size} must exceed 2 (real codes + BOC + EOC)")
    return cfg


def _check_cross(spec: ModelSpec, where: str) -> None:
    """Checks that span sections: the talker's audio vocabulary must be the codec's."""
    if spec.audio.out_dim is not None and spec.audio.out_dim != spec.text.hidden_size:
        # The fused audio embedding replaces the token embedding, so it must be hidden-sized.
        raise ConfigError(f"{where}: audio_encoder_config.out_dim = {spec.audio.out_dim} must equal "
                          f"text_config.hidden_size = {spec.text.hidden_size}")
    if spec.audio.num_real_codes != spec.codec.codebook_size:
        raise ConfigError(f"{where}: audio_encoder_config.vocab_size = {spec.audio.codebook_size} must be the "
                          f"codec codebook_size + 2 = {spec.codec.codebook_size + 2}")
    if spec.audio.num_codebooks != spec.codec.num_quantizers:
        raise ConfigError(f"{where}: audio_encoder_config.num_codebooks = {spec.audio.num_codebooks} must equal "
                          f"the codec's number of quantizers {spec.codec.num_quantizers}")


_MISSING = object()


def _get(d: dict[str, Any], key: str, typ: type, where: str, default: Any = _MISSING) -> Any:
    """d[key] checked against `typ` (ints accepted for floats, bools never for ints)."""
    if key not in d or d[key] is None:
        if default is _MISSING:
            raise ConfigError(f"{where}.{key} is required but missing")
        return default
    v = d[key]
    ok = isinstance(v, typ) and not (typ in (int, float) and isinstance(v, bool))
    if typ is float and is_int(v):
        ok, v = True, float(v)
    if not ok:
        raise ConfigError(f"{where}.{key} = {v!r} must be of type {typ.__name__}")
    return v


# ---------------------------------------------------------------------------------------------
# writing (the tiny-model writer and `config show`)


def spec_to_config_dict(spec: ModelSpec, *, include_codec: bool = True) -> dict[str, Any]:
    """The config.json dict for `spec`; `parse_model_spec(spec_to_config_dict(s)) == s`.

    include_codec=False leaves `audio_tokenizer_config` out, meaning the Higgs v2 defaults.
    """
    t, a = spec.text, spec.audio
    d: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": list(spec.architectures),
        "torch_dtype": spec.torch_dtype,
        "text_config": {
            "model_type": "qwen3",
            "hidden_size": t.hidden_size,
            "num_hidden_layers": t.num_layers,
            "num_attention_heads": t.num_heads,
            "num_key_value_heads": t.num_kv_heads,
            "head_dim": t.head_dim,
            "intermediate_size": t.intermediate_size,
            "vocab_size": t.vocab_size,
            "rms_norm_eps": t.rms_norm_eps,
            "rope_theta": t.rope_theta,
            "max_position_embeddings": t.max_position_embeddings,
            "tie_word_embeddings": t.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
        },
        "audio_encoder_config": {
            "encoder_type": "discrete",
            "num_codebooks": a.num_codebooks,
            "vocab_size": a.codebook_size,
            "tie_word_embeddings": a.tie_word_embeddings,
        },
    }
    if a.out_dim is not None:
        d["audio_encoder_config"]["out_dim"] = a.out_dim
    if include_codec:
        d["audio_tokenizer_config"] = spec.codec.to_hf_dict()
    return d
