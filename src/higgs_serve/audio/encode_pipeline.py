"""One response's encoding, synchronously: float32 chunks at the model's rate in, the format's
bytes out (docs/architecture.md#the-last-mile).

    chunk ─▶ time stretch (speed != 1) ─▶ resample ─▶ float_to_int16 (the one conversion)
          ─▶ incremental encoder ─▶ bytes

The server's `AudioOut` runs it in its own process (cheap formats), on a thread, or in an encoder
process (audio/encode_worker.py), whichever it was given; the stages are the same everywhere, so
where a response is encoded cannot change its bytes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from higgs_serve.audio.encoders import CPU_HEAVY_FORMATS, Patch, open_encoder
from higgs_serve.audio.formats import float_to_int16
from higgs_serve.audio.output_rate import StreamResampler
from higgs_serve.audio.time_stretch import TimeStretcher


@dataclass(frozen=True)
class EncodeSpec:
    """What one response's pipeline makes (it crosses to encoder processes as JSON)."""

    response_format: str
    model_rate_hz: int
    sample_rate_hz: int
    speed: float = 1.0
    seekable: bool = False  # the bytes become a file whose header is patched at the end

    @property
    def cpu_heavy(self) -> bool:
        """A codec or the time stretch: real CPU per chunk, which the server keeps away from its
        event loop; pcm, wav and G.711 at speed 1 cost a copy or a table lookup."""
        return self.response_format in CPU_HEAVY_FORMATS or self.speed != 1.0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EncodeSpec:
        return cls(**json.loads(data))


class EncodePipeline:
    def __init__(self, spec: EncodeSpec):
        self.spec = spec
        self._stretcher = TimeStretcher(spec.speed) if spec.speed != 1.0 else None
        self._resampler = StreamResampler(spec.model_rate_hz, spec.sample_rate_hz)
        self._encoder = open_encoder(spec.response_format, spec.sample_rate_hz, spec.seekable)
        self.closed = False

    def convert(self, audio: np.ndarray, last: bool) -> bytes:
        """audio: [n] float32 at the model's rate -> the bytes ready so far; `last` flushes
        everything still held (resampler tail, the codec's buffered frames, the trailer)."""
        if self.closed:
            raise RuntimeError("EncodePipeline used after close")
        self.closed = last
        signal = audio
        if self._stretcher is not None:
            signal = self._stretcher.push(signal)
            if last:
                signal = np.concatenate([signal, self._stretcher.close()])
        data = self._encoder.push(float_to_int16(self._resampler.push(signal, last=last)))
        return data + self._encoder.close() if last else data

    def patches(self) -> list[Patch]:
        """After the last convert: header rewrites for a file (see audio/encoders)."""
        return self._encoder.patches()
