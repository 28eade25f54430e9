"""Formats written by one of FFmpeg's muxers through PyAV: mp3 (libmp3lame), aac (ADTS) and flac.

The muxer writes into `_Sink`, which hands each push's new bytes back at once. For a file the sink
says it is seekable, so the muxer writes what needs the whole signal (the mp3 LAME/Info frame,
the FLAC STREAMINFO length and MD5) by seeking back at close; those writes land on bytes already
returned and are kept as patches for the file to apply. For a stream the sink is not seekable and
the muxer writes nothing it would have to come back to. PyAV encodes with the GIL released, so
several responses encode on several cores at once.
"""

from __future__ import annotations

import numpy as np

from higgs_serve.audio.encoders.base import Patch, StreamEncoder


class _Sink:
    """The file object PyAV writes to: new bytes wait in `pending` until `take`; a write over
    bytes already taken becomes a patch."""

    def __init__(self, seekable: bool):
        self._seekable = seekable
        self._pending = bytearray()
        self._taken = 0  # bytes already handed out
        self._position = 0
        self.patches: list[Patch] = []

    @property
    def _length(self) -> int:
        return self._taken + len(self._pending)

    def write(self, data) -> int:
        data = bytes(data)
        size = len(data)
        start, end = self._position, self._position + size
        if start < self._taken:  # a rewrite of bytes already handed out: a patch
            cut = min(end, self._taken)
            self.patches.append((start, data[:cut - start]))
            data, start = data[cut - start:], cut
        if data:
            if start > self._length:
                raise ValueError("the muxer seeked past the end of its output")
            offset = start - self._taken
            self._pending[offset:offset + len(data)] = data
        self._position = end
        return size

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: self._length}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def seekable(self) -> bool:
        return self._seekable

    def take(self) -> bytes:
        data = bytes(self._pending)
        self._taken += len(data)
        self._pending.clear()
        return data


class MuxedEncoder(StreamEncoder):
    """One PyAV output container with one mono audio stream."""

    cpu_heavy = True

    def __init__(self, container_format: str, codec: str, sample_format: str,
                 sample_rate_hz: int, seekable: bool, bit_rate: int | None = None,
                 codec_options: dict[str, str] | None = None,
                 container_options: dict[str, str] | None = None):
        import av  # PyAV: loaded with the first compressed response, not at server import

        self._av = av
        self._sink = _Sink(seekable)
        self._container = av.open(self._sink, "w", format=container_format,
                                  container_options=container_options or {})
        self._stream = self._container.add_stream(codec, rate=sample_rate_hz, layout="mono",
                                                  options=codec_options or {})
        if bit_rate is not None:
            self._stream.codec_context.bit_rate = bit_rate
        self._stream.codec_context.format = sample_format
        self._float = sample_format == "fltp"  # the AAC encoder takes float samples
        self.sample_rate_hz = sample_rate_hz
        self._samples_in = 0
        self._closed = False

    def push(self, samples: np.ndarray) -> bytes:
        samples = np.asarray(samples, dtype=np.int16)
        if samples.size:
            self._mux(self._stream.encode(self._frame(samples)))
        return self._sink.take()

    def _frame(self, samples: np.ndarray):
        if self._float:  # exact: every int16 value is a float32
            data, fmt = (samples.astype(np.float32) / 32768.0)[None, :], "fltp"
        else:
            data, fmt = samples[None, :], "s16"
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=fmt,
                                                 layout="mono")
        frame.sample_rate = self.sample_rate_hz
        frame.pts = self._samples_in
        self._samples_in += samples.size
        return frame

    def _mux(self, packets) -> None:
        for packet in packets:
            self._container.mux(packet)

    def close(self) -> bytes:
        if not self._closed:
            self._closed = True
            self._mux(self._stream.encode(None))
            self._container.close()  # the trailer (and, for a file, the seek-back rewrites)
        return self._sink.take()

    def patches(self) -> list[Patch]:
        return list(self._sink.patches)

    def abandon(self) -> None:
        """Close the container without flushing the codec. An output container dropped unclosed
        keeps FFmpeg's muxer and codec buffers until the collector frees it, if ever: an
        encoder process grew by 44 MB over 60 abandoned streams, by 130 MB over 60 FLAC ones
        (benchmarks/limits/bench_abandoned_streams.py measures it flat now)."""
        if not self._closed:
            self._closed = True
            self._container.close()
