"""What the routers share: the engine, settings, voices, metrics and the admission gate.

One `ServerState` per app, stored on `app.state.server`; routers read it with `server_state`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from fastapi import Request

from higgs_serve.alignment.pool import AlignerPool
from higgs_serve.audio.provenance import Provenance
from higgs_serve.audio.watermark_detect import LazyDetector
from higgs_serve.config.deploy import DeployConfig
from higgs_serve.engine.core import EngineHooks
from higgs_serve.engine.speech import AudioChunk, SpeechRequest
from higgs_serve.metrics import ServerMetrics
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.server.last_mile.encode_pool import EncodePool
from higgs_serve.server.limits.detect_slots import DetectSlots
from higgs_serve.server.settings import AUDIO_WORKERS, ServerSettings
from higgs_serve.voices.registry import VoiceRegistry

# Reference clip -> codec codes, for voice cloning: audio [n] float32 at 24 kHz -> [T, 8] int64.
# Runs in a worker thread. None in build_app means cloning is not enabled (requests get a 400).
ReferenceEncoder = Callable[[np.ndarray], np.ndarray]


class SpeechEngine(Protocol):
    """The part of `AsyncEngine` the server uses (docs/architecture.md, "Engine front end")."""

    sample_rate_hz: int
    deploy: DeployConfig
    ready: bool

    @property
    def alive(self) -> bool: ...

    @property
    def prompt_builder(self): ...  # count_text_tokens(text) -> int; None before start()

    async def start(self, hooks: EngineHooks | None = None) -> None: ...

    async def shutdown(self) -> None: ...

    # The stream's `frames` ([T, 8] codes) are set once its final chunk arrived: long-form
    # chains (engine/long_form.py) clone each segment from the one before. Its `queue_wait_s`
    # (float | None) is a stream's wait for its place in the engine, known after its first chunk;
    # its `withdraw_at_s` (float | None) when a stream still waiting is to be withdrawn.
    def generate(self, request: SpeechRequest) -> AsyncIterator[AudioChunk]: ...

    def abort(self, request_id: str) -> None: ...

    # A stream's audio left for its listener: (request id, samples at the engine's rate,
    # time.perf_counter()) -> its playback clock (engine/deadlines/playback_clock.py).
    def audio_sent(self, request_id: str, samples: int, at_s: float) -> None: ...

    def stats(self) -> Mapping[str, float]: ...


class AdmissionGate:
    """Bounds the speech requests in flight (running + waiting); the event loop is its only user."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.in_flight = 0

    def try_acquire(self) -> bool:
        if self.in_flight >= self.capacity:
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        if self.in_flight <= 0:
            raise RuntimeError("admission gate released more often than acquired")
        self.in_flight -= 1


@dataclass
class ServerState:
    engine: SpeechEngine
    settings: ServerSettings
    voices: VoiceRegistry
    metrics: ServerMetrics
    gate: AdmissionGate
    reference_encoder: ReferenceEncoder | None
    audio_workers: AudioWorkers = field(default_factory=lambda: AudioWorkers(AUDIO_WORKERS))
    # POST /v1/audio/watermark/detect: on the CPU, loaded at its first request
    detector: LazyDetector = field(default_factory=LazyDetector)
    # detections in flight (None: built from the settings' --detect-wait-s)
    detect_slots: DetectSlots | None = None
    # signs whole files (C2PA) when the operator gave a certificate and key; None: unsigned
    provenance: Provenance | None = None
    # response encoding (server/last_mile/audio_out.py), apart from reference work: --encode-threads
    # (codecs with --encode-processes 0; C2PA signing)
    encode_workers: AudioWorkers | None = None
    # word timestamps' aligner processes (--alignment-workers; started at the first use);
    # None: alignment_workers is 0 and word_timestamps is refused
    aligner_pool: AlignerPool | None = None
    # the codecs and the time stretch in encoder processes (--encode-processes; None with 0)
    encode_pool: EncodePool | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))
    engine_started: bool = False  # start() returned: from now on `alive` False means dead
    engine_start_error: BaseException | None = None
    # admitted requests not yet closed (Generation, server/run/generation.py; LongFormRun,
    # server/run/long_form.py): aborted when the shutdown's grace period ends, so each ends its
    # own response (503 or a stream error event)
    generations: set = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.encode_workers is None:
            self.encode_workers = AudioWorkers(self.settings.encode_threads, "higgs-encode")
        settings = self.settings
        if self.detect_slots is None:
            self.detect_slots = DetectSlots(wait_s=settings.detect_wait_s)
        if self.aligner_pool is None and settings.alignment_workers > 0:
            self.aligner_pool = AlignerPool(settings.alignment_workers, timeout_s=settings.worker_timeout_s,
                                            queue_s=settings.alignment_queue_s,
                                            placement=settings.worker_placement)
        if self.encode_pool is None and settings.encode_processes > 0:
            self.encode_pool = EncodePool(settings.encode_processes, timeout_s=settings.worker_timeout_s,
                                          placement=settings.worker_placement)

    @property
    def encoders(self) -> EncodePool | AudioWorkers:
        """Where responses' codecs run (server/last_mile/audio_out.py)."""
        return self.encode_pool if self.encode_pool is not None else self.encode_workers

    def abort_in_flight(self) -> None:
        for generation in list(self.generations):
            generation.abort()

    def engine_dead(self) -> bool:
        """Start failed, or start finished and the engine loop has since stopped."""
        if self.engine_start_error is not None:
            return True
        return self.engine_started and not self.engine.alive

    def engine_ready(self) -> bool:
        """Warm-up finished and the engine is alive: speech requests may be admitted."""
        return not self.engine_dead() and self.engine_started and self.engine.ready


def server_state(request: Request) -> ServerState:
    return request.app.state.server
