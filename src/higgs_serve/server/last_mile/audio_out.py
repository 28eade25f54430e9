"""One response's last mile (docs/architecture.md#the-last-mile): the engine's float32 24 kHz
chunks in, the bytes of the response format out, as they are made.

    chunk ─▶ taps (24 kHz float, e.g. timestamps) ─▶ time stretch (speed != 1) ─▶ resample
          ─▶ float_to_int16 (the one conversion) ─▶ incremental encoder ─▶ bytes

Every way audio leaves the server goes through one `AudioOut` per response (per sentence on the
WebSocket): raw HTTP streams, SSE deltas, long-form, WebSocket sentences and whole files
(server/last_mile/audio_file.py), so a format is encoded one way everywhere. The stages after the taps are
audio/encode_pipeline.py's, run where their cost belongs:
- pcm, wav and G.711 at speed 1 (a copy or a table lookup): right here, on the event loop;
- a codec (mp3, aac, flac, opus) or the time stretch, given an `EncodePool`: in the response's
  encoder process (server/last_mile/encode_pool.py, --encode-processes), away from the server's GIL;
- the same given `AudioWorkers` (--encode-processes 0): on the encode threads, one chunk at a
  time per response (PyAV and NumPy release the GIL for part of the work).
The taps always run in the server process: on the event loop, or on the encode thread with
`AudioWorkers`; a tap must be cheap and thread-safe (it hands the audio on).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from higgs_serve.audio.encode_pipeline import EncodePipeline, EncodeSpec
from higgs_serve.audio.encoders import Patch
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.server.last_mile.encode_pool import EncodePool
from higgs_serve.server.last_mile.playback_meter import PlaybackMeter

# A tap sees each chunk of the response's audio as the engine made it: [n] float32 at 24 kHz.
AudioTap = Callable[[np.ndarray], None]


class AudioOut:
    def __init__(self, response_format: str, model_rate_hz: int, sample_rate_hz: int,
                 speed: float, workers: AudioWorkers | EncodePool, seekable: bool = False,
                 taps: tuple[AudioTap, ...] = (), meter: PlaybackMeter | None = None):
        """seekable: the bytes are collected into a file that `patches` will be applied to.
        meter: a stream's, told of each chunk as its bytes are ready to leave
        (server/last_mile/playback_meter.py)."""
        spec = EncodeSpec(response_format, model_rate_hz, sample_rate_hz, speed, seekable)
        self.taps = list(taps)
        self.meter = meter
        self.closed = False
        self._remote = None
        self._local = self._threads = None
        if spec.cpu_heavy and isinstance(workers, EncodePool):
            self._remote = workers.open(spec)
            # Backstop for an owner that never calls release(): the collector frees the
            # pipeline. Only a backstop: a response that ends by an exception is often held by
            # its traceback's reference cycle until a full collection, seconds or minutes later.
            weakref.finalize(self, self._remote.release_later).atexit = False
        else:
            self._local = EncodePipeline(spec)
            self._threads = workers if spec.cpu_heavy else None

    async def push(self, audio: np.ndarray) -> bytes:
        """audio: [n] float32 at the model's rate -> the bytes ready so far (maybe none)."""
        return await self._run(audio, False)

    async def close(self, audio: np.ndarray | None = None) -> bytes:
        """The last audio (if any) and everything still held: resampler tail, codec, trailer."""
        return await self._run(np.zeros(0, np.float32) if audio is None else audio, True)

    @property
    def restarts(self) -> int:
        """Times the encoding started over on another encoder process (its process lost before
        any byte left); the bytes of the call that restarted it are all the bytes from the start
        (server/last_mile/encode_pool.py)."""
        return self._remote.restarts if self._remote is not None else 0

    def patches(self) -> list[Patch]:
        """After close: header rewrites for a file (see audio/encoders)."""
        return self._remote.patches() if self._remote is not None else self._local.patches()

    def release(self) -> None:
        """The response is over, closed or not: an encoder process frees its pipeline (and
        stops counting it for assignment) now. Idempotent; nothing to do for a pipeline in this
        process. Every owner calls it in a `finally`."""
        if self._remote is not None:
            self._remote.release()

    async def _run(self, audio: np.ndarray, last: bool) -> bytes:
        data = await self._encode(audio, last)
        if self.meter is not None:
            self.meter.sent(audio.size)
        return data

    async def _encode(self, audio: np.ndarray, last: bool) -> bytes:
        if self._remote is not None:
            self._tap(audio, last)
            try:
                return await self._remote.convert(audio, last)
            except BaseException:  # a chunk that failed or was cancelled ends the response
                self._remote.release()
                raise
        if self._threads is not None:
            return await self._threads.run(self.convert, audio, last)
        return self.convert(audio, last)

    def convert(self, audio: np.ndarray, last: bool) -> bytes:
        """The pipeline in this process, synchronously (in whichever thread calls it)."""
        if self._local is None:
            raise RuntimeError("this AudioOut encodes in an encoder process: use push/close")
        self._tap(audio, last)
        return self._local.convert(audio, last)

    def _tap(self, audio: np.ndarray, last: bool) -> None:
        if self.closed:
            raise RuntimeError("AudioOut used after close")
        self.closed = last
        for tap in self.taps:
            tap(audio)
