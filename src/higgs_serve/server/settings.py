"""Server settings: built once from the command line, frozen."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Long inputs are split into segments and spoken as one recording (server/long_form.py).
DEFAULT_MAX_INPUT_CHARS = 100_000
DEFAULT_SEGMENT_MAX_CHARS = 300  # about 20 s of speech: a sentence group per engine request
DEFAULT_MAX_AUDIO_S = 7200.0  # a long-form response or WebSocket session stops here
DEFAULT_WS_IDLE_TIMEOUT_S = 30.0
DEFAULT_MAX_REF_AUDIO_BYTES = 10 * 1024 * 1024
DEFAULT_VOICES_DIR = Path.home() / ".cache" / "higgs-serve" / "voices"


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    served_model_name: str = "higgs-audio-v3"
    # Also accepted as `model` in requests (the path or hub id the server was started with).
    model_aliases: tuple[str, ...] = ()
    # Requests allowed to wait beyond the engine's running slots (max_num_seqs); past it, 429.
    max_queue: int = 64
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
    # Long-form and WebSocket text: segment size, total audio per response/session, and how
    # long a WebSocket session may sit with no message and nothing to speak before it is closed.
    segment_max_chars: int = DEFAULT_SEGMENT_MAX_CHARS
    max_audio_s: float = DEFAULT_MAX_AUDIO_S
    ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S
    voices_dir: Path = field(default_factory=lambda: DEFAULT_VOICES_DIR)
    # Hosts whose http(s) URLs may be fetched for `ref_audio`; empty = URLs are refused.
    allowed_ref_audio_domains: tuple[str, ...] = ()
    max_ref_audio_bytes: int = DEFAULT_MAX_REF_AUDIO_BYTES
    # Seconds uvicorn lets in-flight requests finish on shutdown before they are aborted.
    graceful_shutdown_s: int = 30

    def __post_init__(self) -> None:
        positive = {"port": self.port, "max_input_chars": self.max_input_chars,
                    "max_ref_audio_bytes": self.max_ref_audio_bytes,
                    "segment_max_chars": self.segment_max_chars, "max_audio_s": self.max_audio_s,
                    "ws_idle_timeout_s": self.ws_idle_timeout_s}
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"server setting {name} must be positive, got {value}")
        if self.max_queue < 0:
            raise ValueError(f"server setting max_queue must be >= 0, got {self.max_queue}")
        if not self.served_model_name:
            raise ValueError("server setting served_model_name must not be empty")
        object.__setattr__(self, "voices_dir", Path(self.voices_dir))
        object.__setattr__(self, "allowed_ref_audio_domains",
                           tuple(host.lower() for host in self.allowed_ref_audio_domains))
