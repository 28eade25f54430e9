"""Server settings: built once from the command line, frozen."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from higgs_serve.alignment.pool import DEFAULT_QUEUE_S as DEFAULT_ALIGNMENT_QUEUE_S
from higgs_serve.config.worker_processes import DEFAULT_WORKER_NICE, DEFAULT_WORKER_TIMEOUT_S, WorkerPlacement
from higgs_serve.errors import ConfigError

# Long inputs are split into segments and spoken as one recording (server/run/long_form.py).
DEFAULT_MAX_INPUT_CHARS = 100_000
DEFAULT_SEGMENT_MAX_CHARS = 300  # about 20 s of speech: a sentence group per engine request
DEFAULT_MAX_AUDIO_S = 7200.0  # a long-form response or WebSocket session stops here
DEFAULT_WS_IDLE_TIMEOUT_S = 30.0
DEFAULT_MAX_REF_AUDIO_BYTES = 10 * 1024 * 1024
DEFAULT_SEND_TIMEOUT_S = 30.0
# A watermark detection that finds every detection slot busy waits at most this long for one
# (server/limits/detect_slots.py): a batch of small checks waits its turn instead of a 429.
DEFAULT_DETECT_WAIT_S = 5.0
# A streamed request whose first audio the engine predicts later than this (its queue wait while
# the engine speaks all the streams it can in real time, then its first chunk) gets 503 with
# Retry-After at once (engine/deadlines/; docs/api.md#over-capacity): a listener waits at most
# about this long for a stream that then plays without a gap, instead of one that stutters.
DEFAULT_TTFA_BUDGET_S = 1.0
# Request bodies, counted while they arrive (server/limits/body_limit.py): JSON room for a base64
# ref_audio of max_ref_audio_bytes (4/3 of it) plus input and ref_text; uploads get the file
# limit (voices/registry.py MAX_UPLOAD_BYTES) plus the multipart envelope.
JSON_BODY_OVERHEAD_BYTES = 1024 * 1024
MULTIPART_OVERHEAD_BYTES = 64 * 1024
AUDIO_WORKERS = 4  # threads for decoding and encoding reference clips (server/last_mile/audio_workers.py)
# Threads that encode responses (server/last_mile/audio_out.py): PyAV releases the GIL, so one a core lets
# encoding use the whole host (benchmarks/results/README.md, bench_encoders).
DEFAULT_ENCODE_THREADS = max(4, os.cpu_count() or 1)
# Word timestamps (server/last_mile/word_timestamps.py): aligner worker processes, started at the first
# request that asks for timestamps. PocketSphinx costs about 0.02 CPU-s per audio second
# (benchmarks/results/alignment_accuracy.json), so one process keeps up with ~50 audio s/s; a GPU
# host serving ~1,000 audio s/s with every request timed needs more: a quarter of the cores, at
# most 4 by default (--alignment-workers raises it; 0 turns word timestamps off).
DEFAULT_ALIGNMENT_WORKERS = max(1, min(4, (os.cpu_count() or 1) // 4))
# Encoder processes (server/last_mile/encode_pool.py): the codecs and the time stretch in processes of
# their own, off the server's GIL. One per core the host gives this server, less
# SERVER_RESERVED_CORES for the server's own threads (event loop, engine loop, codec stage), at
# most MAX_DEFAULT_ENCODE_PROCESSES (at the measured cost of the costliest format, 32 cores encode
# more audio per second than one GPU makes: benchmarks/results/README.md, bench_encode_gil).
SERVER_RESERVED_CORES = 2
MAX_DEFAULT_ENCODE_PROCESSES = 32


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_worker_cpus(servers: int) -> str:
    """`worker_cpus` for each of `servers` servers sharing the host: "auto" keeps
    SERVER_RESERVED_CORES for each server's own process (the same cores for all of them)."""
    placement = WorkerPlacement.resolve("auto", 0, SERVER_RESERVED_CORES * servers)
    return "all" if placement.cpus is None else ",".join(map(str, sorted(placement.cpus)))


def default_encode_processes(servers: int = 1) -> int:
    """Encoder processes per server when `servers` servers (data-parallel replicas) share the
    host: what is left of its cores after each server's own, shared out; at least one each."""
    spare = host_cores() - SERVER_RESERVED_CORES * servers
    return max(1, min(MAX_DEFAULT_ENCODE_PROCESSES, spare // servers))


DEFAULT_ENCODE_PROCESSES = default_encode_processes()
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # an alias name (--voice-alias)
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
    # Long-form and WebSocket text: segment size, total audio per response/session, and how
    # long a WebSocket session may sit with no message and nothing to speak before it is closed.
    segment_max_chars: int = DEFAULT_SEGMENT_MAX_CHARS
    max_audio_s: float = DEFAULT_MAX_AUDIO_S
    ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S
    voices_dir: Path = field(default_factory=lambda: DEFAULT_VOICES_DIR)
    # Hosts whose http(s) URLs may be fetched for `ref_audio`; empty = URLs are refused.
    allowed_ref_audio_domains: tuple[str, ...] = ()
    max_ref_audio_bytes: int = DEFAULT_MAX_REF_AUDIO_BYTES
    # Directory whose files may be named as reference audio (path or file:// URL); None = refused.
    allowed_local_media_path: Path | None = None
    # Seconds uvicorn lets in-flight requests finish on shutdown before they are aborted.
    graceful_shutdown_s: int = 30
    # A response write that waits longer (the client stopped reading) ends the response, which
    # aborts its engine request and frees its admission slot (server/limits/send_timeout.py).
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    # Refuse (503 + Retry-After) a stream whose predicted time to first audio exceeds this.
    ttfa_budget_s: float = DEFAULT_TTFA_BUDGET_S
    # Signed provenance (audio/provenance.py): the operator's PEM certificate chain and private
    # key; with both, wav/mp3/flac files carry a C2PA manifest. An optional RFC 3161 timestamp
    # authority URL countersigns each manifest's signature time.
    c2pa_cert: Path | None = None
    c2pa_key: Path | None = None
    c2pa_tsa_url: str | None = None
    encode_threads: int = DEFAULT_ENCODE_THREADS
    # 0: encode in this process, on the encode threads (small deployments, tests)
    encode_processes: int = DEFAULT_ENCODE_PROCESSES
    # `voice` names that stand for another voice: (alias, target) pairs, target a registered voice
    # or "default" (--voice-alias alloy=default), so OpenAI-only clients can name a voice.
    voice_aliases: tuple[tuple[str, str], ...] = ()
    # aligner worker processes for `word_timestamps` (0: the field is refused with a 400)
    alignment_workers: int = DEFAULT_ALIGNMENT_WORKERS
    # seconds of audio that may wait for one aligner process (past it: a words overload error)
    alignment_queue_s: float = DEFAULT_ALIGNMENT_QUEUE_S
    # a watermark detection that finds every detection slot busy waits this long at most for
    # one; past it (or when it plainly would), 429 with Retry-After (server/limits/detect_slots.py)
    detect_wait_s: float = DEFAULT_DETECT_WAIT_S
    # a worker process (encoder, aligner) owing an answer this long is killed and replaced
    worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S
    # the worker processes' cores ("auto", "all" or a list such as "2-7") and added niceness
    # (config/worker_processes.py: "auto" leaves SERVER_RESERVED_CORES to the engine's process
    # when enough are left); resolved once into `worker_placement`
    worker_cpus: str = "auto"
    worker_nice: int = DEFAULT_WORKER_NICE
    worker_placement: WorkerPlacement = field(init=False, repr=False, compare=False)
    # the playground page at / (server/routers/playground.py; --no-playground: not served, / is
    # a 404): static files from the package, public like /docs, its API calls keyed as any
    playground: bool = True

    @property
    def max_json_body_bytes(self) -> int:
        """The largest JSON body accepted (413 past it)."""
        return 4 * -(-self.max_ref_audio_bytes // 3) + JSON_BODY_OVERHEAD_BYTES

    @property
    def max_ws_message_bytes(self) -> int:
        """The largest WebSocket message: a session.config carries what a JSON body does (a
        base64 reference of max_ref_audio_bytes), so the same bound. uvicorn closes a connection
        whose message is larger (1009); a text message longer in characters is refused."""
        return self.max_json_body_bytes

    def __post_init__(self) -> None:
        # each refusal names what the user set: the flag (`serve --max-queue`), or the setting
        # where no flag sets it
        positive = {"--port": self.port, "--max-input-chars": self.max_input_chars,
                    "server setting max_ref_audio_bytes": self.max_ref_audio_bytes,
                    "--send-timeout-s": self.send_timeout_s, "--ttfa-budget-s": self.ttfa_budget_s,
                    "--segment-max-chars": self.segment_max_chars, "--max-audio-s": self.max_audio_s,
                    "--ws-idle-timeout-s": self.ws_idle_timeout_s,
                    "--encode-threads": self.encode_threads,
                    "--alignment-queue-s": self.alignment_queue_s,
                    "--worker-timeout-s": self.worker_timeout_s}
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        for name, value in {"--max-queue": self.max_queue, "--encode-processes": self.encode_processes,
                            "--alignment-workers": self.alignment_workers,
                            "--detect-wait-s": self.detect_wait_s}.items():
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        if not isinstance(self.playground, bool):
            raise ConfigError(f"server setting playground must be true or false, got {self.playground!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key must not be empty (an empty key would accept "
                              "an empty bearer token); leave --api-key out to serve without one")
        if self.api_key is not None and not self.api_key.isascii():
            raise ConfigError("--api-key must be ASCII (HTTP headers carry bytes)")
        if not self.served_model_name:
            raise ConfigError("--served-model-name must not be empty")
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
        if (self.c2pa_cert is None) != (self.c2pa_key is None):
            raise ConfigError("--c2pa-cert and --c2pa-key sign C2PA manifests together: give both or neither")
        if self.c2pa_tsa_url is not None and self.c2pa_cert is None:
            raise ConfigError("--c2pa-tsa-url timestamps C2PA signatures: give --c2pa-cert and --c2pa-key too")
        if self.c2pa_tsa_url is not None and not self.c2pa_tsa_url.startswith(("http://", "https://")):
            raise ConfigError(f"--c2pa-tsa-url must be an http(s) URL, got {self.c2pa_tsa_url!r}")
        object.__setattr__(self, "allowed_ref_audio_domains",
                           tuple(host.lower() for host in self.allowed_ref_audio_domains))
        self._check_voice_aliases()
        object.__setattr__(self, "worker_placement", WorkerPlacement.resolve(
            self.worker_cpus, self.worker_nice, SERVER_RESERVED_CORES))

    def _check_voice_aliases(self) -> None:
        seen: dict[str, str] = {}
        for alias, target in self.voice_aliases:
            for name in (alias, target):
                if not VOICE_NAME.fullmatch(name):
                    raise ConfigError(f"--voice-alias {alias}={target}: {name!r} is not a voice "
                                      "name (letters, digits, '.', '_', '-'; at most 64)")
            if alias == "default":
                raise ConfigError("--voice-alias: 'default' is the zero-shot voice and cannot be "
                                  "an alias")
            if alias == target:
                raise ConfigError(f"--voice-alias {alias}={target}: an alias of itself")
            if seen.get(alias, target) != target:
                raise ConfigError(f"--voice-alias {alias} is given twice, as {seen[alias]!r} and "
                                  f"{target!r}")
            seen[alias] = target
        if any(target in seen for target in seen.values()):
            raise ConfigError("--voice-alias: an alias must name a voice, not another alias")

    @property
    def voice_alias_map(self) -> dict[str, str]:
        return dict(self.voice_aliases)

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Every name /v1/models lists (the first is the primary one)."""
        return tuple(dict.fromkeys((self.served_model_name, *self.extra_served_model_names)))
