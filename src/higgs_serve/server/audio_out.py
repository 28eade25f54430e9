"""One response's last mile (docs/architecture.md#the-last-mile): the engine's float32 24 kHz
chunks in, the bytes of the response format out, as they are made.

    chunk ─▶ taps (24 kHz float, e.g. timestamps) ─▶ time stretch (speed != 1) ─▶ resample
          ─▶ float_to_int16 (the one conversion) ─▶ incremental encoder ─▶ bytes

Every way audio leaves the server goes through one `AudioOut` per response (per sentence on the
WebSocket): raw HTTP streams, SSE deltas, long-form, WebSocket sentences and whole files
(server/audio_file.py), so a format is encoded one way everywhere. A stage that costs real CPU
(a codec, the time stretch) runs on the encode pool's threads, one chunk at a time per response
and never on the event loop; PyAV and NumPy release the GIL there, so responses encode on as
many cores as the pool has threads (--encode-threads).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from higgs_serve.audio.encoders import Patch, open_encoder
from higgs_serve.audio.formats import float_to_int16
from higgs_serve.audio.output_rate import StreamResampler
from higgs_serve.audio.time_stretch import TimeStretcher
from higgs_serve.server.audio_workers import AudioWorkers

# A tap sees each chunk of the response's audio as the engine made it: [n] float32 at 24 kHz.
AudioTap = Callable[[np.ndarray], None]


class AudioOut:
    def __init__(self, response_format: str, model_rate_hz: int, sample_rate_hz: int,
                 speed: float, workers: AudioWorkers, seekable: bool = False,
                 taps: tuple[AudioTap, ...] = ()):
        """seekable: the bytes are collected into a file that `patches` will be applied to."""
        self._stretcher = TimeStretcher(speed) if speed != 1.0 else None
        self._resampler = StreamResampler(model_rate_hz, sample_rate_hz)
        self._encoder = open_encoder(response_format, sample_rate_hz, seekable)
        self._workers = workers
        self._off_loop = self._encoder.cpu_heavy or self._stretcher is not None
        self.taps = list(taps)
        self.closed = False

    async def push(self, audio: np.ndarray) -> bytes:
        """audio: [n] float32 at the model's rate -> the bytes ready so far (maybe none)."""
        return await self._run(audio, False)

    async def close(self, audio: np.ndarray | None = None) -> bytes:
        """The last audio (if any) and everything still held: resampler tail, codec, trailer."""
        return await self._run(np.zeros(0, np.float32) if audio is None else audio, True)

    def patches(self) -> list[Patch]:
        """After close: header rewrites for a file (see audio/encoders)."""
        return self._encoder.patches()

    async def _run(self, audio: np.ndarray, last: bool) -> bytes:
        if self._off_loop:
            return await self._workers.run(self.convert, audio, last)
        return self.convert(audio, last)

    def convert(self, audio: np.ndarray, last: bool) -> bytes:
        """The pipeline, synchronously (in whichever thread calls it)."""
        if self.closed:
            raise RuntimeError("AudioOut used after close")
        self.closed = last
        for tap in self.taps:
            tap(audio)
        signal = audio
        if self._stretcher is not None:
            signal = self._stretcher.push(signal)
            if last:
                signal = np.concatenate([signal, self._stretcher.close()])
        data = self._encoder.push(float_to_int16(self._resampler.push(signal, last=last)))
        return data + self._encoder.close() if last else data
