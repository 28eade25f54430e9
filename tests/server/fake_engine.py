"""A fake engine that follows the AsyncEngine contract exactly (docs/architecture.md), for fast
HTTP-layer tests without a model.

Audio is a deterministic function of (seed, frame index): a sine whose pitch depends on the
seed, 960 samples per frame, so equal seeds give equal audio and chunk boundaries never change
the concatenated signal. The number of frames is min(max_new_tokens, frames_per_char * len(text)).
Streaming yields `chunk_frames` frames per chunk with `step_delay_s` between chunks; a request
answered as one file comes as one chunk, or `file_chunk_frames` at a time when that is set (as
the real engine's file windows come while it generates).

Test hooks: `hold` (threading.Event): while clear, requests whose text starts with "HOLD" wait
before their first chunk; a streamed request whose text starts with "FULL" is refused as the real
engine refuses a stream past its first-audio budget (OverCapacityError, Retry-After
`over_capacity_retry_s`); one whose text holds "QUEUED" is to be withdrawn `withdraw_after_s`
after it was submitted (told to retry after `withdrawn_retry_after_s`); `kill()` makes the engine die (every request fails, alive = False).
`sent` records the server's `audio_sent` reports.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator

import numpy as np

from higgs_serve.config.deploy import DeployConfig, DefaultSamplingParams, TalkerStageConfig
from higgs_serve.engine.core import EngineHooks
from higgs_serve.engine.speech import AudioChunk, SpeechRequest
from higgs_serve.errors import EngineDeadError, EngineOverloadedError, OverCapacityError

SAMPLES_PER_FRAME = 960


class _FakePrompts:
    def count_text_tokens(self, text: str) -> int:
        return len(text.split())


def fake_audio(seed: int, start_frame: int, num_frames: int) -> np.ndarray:
    """[num_frames * 960] float32: frames start_frame.. of the seed's sine."""
    freq_hz = 200.0 + seed % 300
    t = np.arange(start_frame * SAMPLES_PER_FRAME, (start_frame + num_frames) * SAMPLES_PER_FRAME)
    return (0.3 * np.sin(2 * np.pi * freq_hz * t / 24000)).astype(np.float32)


def fake_deploy(max_num_seqs: int = 2, max_tokens: int = 200) -> DeployConfig:
    stage0 = TalkerStageConfig(max_num_seqs=max_num_seqs,
                               default_sampling_params=DefaultSamplingParams(max_tokens=max_tokens))
    return DeployConfig(source="fake", stage0=stage0)


class FakeEngine:
    sample_rate_hz = 24000

    def __init__(self, deploy: DeployConfig | None = None, chunk_frames: int = 5,
                 frames_per_char: int = 2, step_delay_s: float = 0.0, file_chunk_frames: int | None = None):
        self.deploy = deploy or fake_deploy()
        self.chunk_frames = chunk_frames
        self.frames_per_char = frames_per_char
        self.step_delay_s = step_delay_s
        self.file_chunk_frames = file_chunk_frames
        self.ready = False
        self.hold = threading.Event()
        self.hold.set()
        self.requests: list[SpeechRequest] = []  # every request received, for assertions
        self.aborted: list[str] = []
        self.sent: list[tuple[str, int, float]] = []  # audio_sent reports
        # test hook: a submit whose text starts with "FULL" is refused as over capacity (503)
        self.over_capacity_retry_s = 3
        # test hook: a streamed request whose text holds "QUEUED" is to be withdrawn this long after
        # it was submitted, as the real engine's streams that wait past their budget (with HOLD it
        # never starts)
        self.withdraw_after_s = 0.2
        self.withdrawn_retry_after_s = 2  # ... and then told to retry after this (the engine's prediction)
        self._active: set[str] = set()
        self._dead = False
        self._prompts: _FakePrompts | None = None
        self.hooks = EngineHooks()

    # --- lifecycle
    async def start(self, hooks: EngineHooks | None = None) -> None:
        self.hooks = hooks or EngineHooks()
        self._prompts = _FakePrompts()
        self.ready = True

    async def shutdown(self) -> None:
        self.ready = False
        for request_id in list(self._active):
            self.abort(request_id)

    @property
    def alive(self) -> bool:
        return self._prompts is not None and not self._dead

    @property
    def prompt_builder(self) -> _FakePrompts | None:
        return self._prompts

    def kill(self) -> None:
        self._dead = True

    # --- requests
    def generate(self, request: SpeechRequest) -> AsyncIterator[AudioChunk]:
        if self._dead:
            raise EngineDeadError("the engine has stopped: killed by the test")
        if len(self._active) >= self.deploy.stage0.max_num_seqs + 64:
            raise EngineOverloadedError("fake queue full")
        if request.text.startswith("FULL") and request.playback is not None:
            raise OverCapacityError("the fake engine is full", self.over_capacity_retry_s)
        self.requests.append(request)
        self._active.add(request.request_id)
        stream = _FakeStream(self._run(request), self.withdrawn_retry_after_s)
        if "QUEUED" in request.text and request.playback is not None:  # waits for a place that never comes
            stream.withdraw_at_s = time.perf_counter() + self.withdraw_after_s
        return stream

    async def _run(self, request: SpeechRequest) -> AsyncIterator[AudioChunk]:
        rid = request.request_id
        try:
            if request.text.startswith("HOLD"):
                while not self.hold.is_set():
                    if rid not in self._active:  # aborted while held (queued)
                        yield AudioChunk(np.zeros(0, np.float32), True, 0, "abort")
                        return
                    await asyncio.sleep(0.01)
            seed = request.sampling.seed if request.sampling.seed is not None else \
                secrets.randbits(31)
            total = min(request.sampling.max_new_tokens, self.frames_per_char * len(request.text))
            reason = "length" if total == request.sampling.max_new_tokens else "stop"
            step = self.chunk_frames if request.stream else (self.file_chunk_frames or total)
            emitted = 0
            while emitted < total:
                await asyncio.sleep(self.step_delay_s)
                if self._dead:
                    raise EngineDeadError("the engine stopped: killed by the test")
                if rid not in self._active:
                    yield AudioChunk(np.zeros(0, np.float32), True, 0, "abort")
                    return
                count = min(step, total - emitted)
                if self.hooks.on_step is not None:  # one fake step: this chunk's frames
                    self.hooks.on_step(self.step_delay_s, 1, count)
                final = emitted + count == total
                if final:
                    self._active.discard(rid)  # finished: the slot is free before the last chunk
                yield AudioChunk(fake_audio(seed, emitted, count), final, count,
                                 reason if final else None)
                emitted += count
        finally:  # closed early (client gone) or failed: abort frees the slot
            self.abort(rid)

    def abort(self, request_id: str) -> None:
        if request_id in self._active:
            self._active.discard(request_id)
            self.aborted.append(request_id)

    def audio_sent(self, request_id: str, samples: int, at_s: float) -> None:
        """The contract's feed of a stream's playback clock: recorded for assertions."""
        self.sent.append((request_id, samples, at_s))

    def stats(self) -> dict[str, int]:
        running = min(len(self._active), self.deploy.stage0.max_num_seqs)
        return {"num_running": running, "num_waiting": len(self._active) - running,
                "free_kv_blocks": 100 - 10 * running, "total_kv_blocks": 100}


class _FakeStream:
    """The contract's request stream: chunks, then `frames` (fake [T, 8] codes, as many as the
    chunks covered) once the final chunk arrived, so long-form chains run on the fake too."""

    def __init__(self, chunks: AsyncIterator[AudioChunk], retry_after_s: int = 1):
        self._chunks = chunks
        self._num_frames = 0
        self.frames: np.ndarray | None = None
        self.queue_wait_s: float | None = 0.0  # the fake never queues ...
        self.withdraw_at_s: float | None = None  # ... so never withdraws a stream
        self._retry_after_s = retry_after_s  # when one withdrawn (the QUEUED hook) may try again

    def retry_after_s(self) -> int:
        return self._retry_after_s

    def __aiter__(self) -> "_FakeStream":
        return self

    async def __anext__(self) -> AudioChunk:
        chunk = await self._chunks.__anext__()
        self._num_frames += chunk.num_frames
        if chunk.is_final and chunk.finish_reason != "abort":
            self.frames = np.arange(self._num_frames * 8, dtype=np.int64).reshape(-1, 8) % 1024
        return chunk

    async def aclose(self) -> None:
        await self._chunks.aclose()
