"""Server settings: built once from the command line, frozen."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from higgs_serve.errors import ConfigError

DEFAULT_MAX_INPUT_CHARS = 4096  # OpenAI's limit for /v1/audio/speech
DEFAULT_MAX_REF_AUDIO_BYTES = 10 * 1024 * 1024
DEFAULT_VOICES_DIR = Path.home() / ".cache" / "higgs-serve" / "voices"


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    served_model_name: str = "higgs-audio-v3"
    # More names the model is served (and listed) under, e.g. a hub id for a local directory.
    extra_served_model_names: tuple[str, ...] = ()
    # Also accepted as `model` in requests (the path or hub id the server was started with).
    model_aliases: tuple[str, ...] = ()
    # Requests allowed to wait beyond the engine's running slots (max_num_seqs); past it, 429.
    max_queue: int = 64
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
    voices_dir: Path = field(default_factory=lambda: DEFAULT_VOICES_DIR)
    # Hosts whose http(s) URLs may be fetched for `ref_audio`; empty = URLs are refused.
    allowed_ref_audio_domains: tuple[str, ...] = ()
    max_ref_audio_bytes: int = DEFAULT_MAX_REF_AUDIO_BYTES
    # Directory whose files may be named as reference audio (path or file:// URL); None = refused.
    allowed_local_media_path: Path | None = None
    # Seconds uvicorn lets in-flight requests finish on shutdown before they are aborted.
    graceful_shutdown_s: int = 30

    def __post_init__(self) -> None:
        positive = {"port": self.port, "max_input_chars": self.max_input_chars,
                    "max_ref_audio_bytes": self.max_ref_audio_bytes}
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"server setting {name} must be positive, got {value}")
        if self.max_queue < 0:
            raise ValueError(f"server setting max_queue must be >= 0, got {self.max_queue}")
        if not self.served_model_name:
            raise ValueError("server setting served_model_name must not be empty")
        object.__setattr__(self, "voices_dir", Path(self.voices_dir))
        if any(not name for name in self.extra_served_model_names):
            raise ConfigError("--served-model-name must not hold empty names")
        if self.allowed_local_media_path is not None:
            # resolved once: requests compare real paths against this real directory
            directory = Path(self.allowed_local_media_path).expanduser().resolve()
            if not directory.is_dir():
                raise ConfigError("--allowed-local-media-path must be an existing directory, "
                                  f"got {self.allowed_local_media_path}")
            object.__setattr__(self, "allowed_local_media_path", directory)
        object.__setattr__(self, "allowed_ref_audio_domains",
                           tuple(host.lower() for host in self.allowed_ref_audio_domains))

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Every name /v1/models lists (the first is the primary one)."""
        return tuple(dict.fromkeys((self.served_model_name, *self.extra_served_model_names)))
