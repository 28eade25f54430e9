"""What both planes of the one-host front end share (cluster/frontend.py): its settings and the
router, replicas, canonical voices and supervisor."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from higgs_serve import __version__
from higgs_serve.audio.provenance import claim_json
from higgs_serve.audio.watermark_detect import DETECT_MAX_BYTES
from higgs_serve.cluster.replicas import POLL_INTERVAL_S, Replica, Supervisor
from higgs_serve.cluster.routing import Router
from higgs_serve.cluster.voice_sync import FanOutRegistry, reconcile, stored_audio_or_none
from higgs_serve.server.settings import (
    DEFAULT_DETECT_WAIT_S,
    DEFAULT_MAX_INPUT_CHARS,
    DEFAULT_SEND_TIMEOUT_S,
    DEFAULT_WS_IDLE_TIMEOUT_S,
    MULTIPART_OVERHEAD_BYTES,
    ServerSettings,
)
from higgs_serve.voices.registry import MAX_UPLOAD_BYTES


@dataclass(frozen=True)
class FrontendSettings:
    """The single server's limits and key, enforced by the front end before a replica sees a
    request (built from the same `ServerSettings` the replicas get: `of`)."""

    api_key: str | None = None
    graceful_shutdown_s: int = 30
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS  # also bounds a voice's ref_text
    max_json_body_bytes: int = ServerSettings().max_json_body_bytes
    max_upload_bytes: int = MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD_BYTES
    max_detect_bytes: int = DETECT_MAX_BYTES + MULTIPART_OVERHEAD_BYTES  # watermark detection
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S
    detect_wait_s: float = DEFAULT_DETECT_WAIT_S  # the control plane's detections, as a server's
    # open client connections the relay allows; None: as many as the open-file limit allows
    # (cluster/relay/connections.py)
    max_connections: int | None = None
    # the replicas sign files (--c2pa-cert): a WebSocket session's upgrade, which the front end
    # answers itself, carries the manifest's claim as theirs do (audio/provenance.py)
    c2pa_claim: str | None = None
    playground: bool = True  # the page at / (--no-playground), served by the control plane

    @classmethod
    def of(cls, server: ServerSettings) -> FrontendSettings:
        return cls(api_key=server.api_key, graceful_shutdown_s=server.graceful_shutdown_s,
                   max_input_chars=server.max_input_chars,
                   max_json_body_bytes=server.max_json_body_bytes,
                   send_timeout_s=server.send_timeout_s, ws_idle_timeout_s=server.ws_idle_timeout_s,
                   detect_wait_s=server.detect_wait_s,
                   c2pa_claim=claim_json(__version__) if server.c2pa_cert is not None else None,
                   playground=server.playground)


class Frontend:
    """Router + replicas + canonical voices + supervisor: what both planes share."""

    def __init__(self, replicas: dict[str, Replica], router: Router, voices_dir: Path,
                 sample_rate_hz: int, settings: FrontendSettings,
                 poll_interval_s: float = POLL_INTERVAL_S):
        self.replicas = replicas
        self.router = router
        self.settings = settings
        self.voices = FanOutRegistry(voices_dir, sample_rate_hz, replicas, self.mark_down)
        self.supervisor = Supervisor(replicas, router, self.sync_voices,
                                     lambda: self.voices.version, poll_interval_s)

    def mark_down(self, replica: Replica) -> None:
        self.supervisor.mark_down(replica)

    def ready_replicas(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.serving]

    async def sync_voices(self, replica: Replica) -> None:
        async def audio(name: str) -> bytes | None:
            return stored_audio_or_none(self.voices, name)

        # everything again: the replica may have missed a replacement while it was away
        await reconcile(self.supervisor.clients[replica.id], "",
                        {v.name: v for v in self.voices.list()}, audio, push_all=True)
