"""One response's encoding, synchronously: float32 chunks at the model's rate in, the format's
bytes out (docs/architecture.md#the-last-mile).

    chunk ─▶ time stretch (speed != 1) ─▶ resample ─▶ float_to_int16 (the one conversion)
          ─▶ incremental encoder ─▶ bytes

A pipeline without float stages (speed 1 at the model's rate: the resampler is the identity)
starts at float_to_int16, so its caller may convert first and hand over int16 (`encode`): the
same function on the same samples, so the same bytes. The server does that for the encoder
processes, which then receive half the bytes (audio/encode_wire.py).

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
    def float_stages(self) -> bool:
        """The time stretch or a resampler runs before the int16 conversion: the pipeline must
        be given float32 (`convert`); without them int16 (`encode`) gives the same bytes."""
        return self.speed != 1.0 or self.model_rate_hz != self.sample_rate_hz

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
        self._check_open(last)
        signal = audio
        if self._stretcher is not None:
            signal = self._stretcher.push(signal)
            if last:
                signal = np.concatenate([signal, self._stretcher.close()])
        return self._encode(float_to_int16(self._resampler.push(signal, last=last)), last)

    def encode(self, samples: np.ndarray, last: bool) -> bytes:
        """samples: [n] int16, float_to_int16 of the chunk -> what `convert` gives for the
        chunk. Only for a spec without `float_stages` (ValueError otherwise)."""
        if self.spec.float_stages:
            raise ValueError("this pipeline stretches or resamples: give it float32 (convert)")
        self._check_open(last)
        return self._encode(samples, last)

    def _check_open(self, last: bool) -> None:
        if self.closed:
            raise RuntimeError("EncodePipeline used after close")
        self.closed = last

    def _encode(self, samples: np.ndarray, last: bool) -> bytes:
        data = self._encoder.push(samples)
        return data + self._encoder.close() if last else data

    def abandon(self) -> None:
        """The response ended without a last chunk: the codec's memory is freed now."""
        self.closed = True
        self._encoder.abandon()

    def patches(self) -> list[Patch]:
        """After the last convert: header rewrites for a file (see audio/encoders)."""
        return self._encoder.patches()
