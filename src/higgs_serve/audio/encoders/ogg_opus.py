"""Ogg/Opus (RFC 7845) written page by page: libopus packets (through PyAV) in Ogg pages of our own.

FFmpeg's Ogg muxer holds a page back until the next one is full (up to a second of audio by
default) so that it can flag the last page; here every push ends the page it started, so a
chunk's packets leave with the chunk. The first page holds the OpusHead (the encoder's, with its
pre-skip), the second the OpusTags; each audio page's granule position counts the 48 kHz samples
of the packets that end on it, and the last page's is the exact end of the input, so decoders
trim the codec's padding and give back exactly the samples pushed (after the pre-skip).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from higgs_serve.audio.encoders.base import StreamEncoder

OPUS_GRANULE_RATE_HZ = 48000  # Ogg/Opus granule positions count 48 kHz samples at any rate
_SERIAL = 0x48494747  # one logical stream per file; any constant will do
_MAX_SEGMENTS = 255
_BOS, _EOS = 0x02, 0x04
# Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, initial value 0) from zlib's reflected
# CRC-32: bit-reverse every byte, run zlib's with its initial and final inversions undone, then
# bit-reverse the 32-bit result.
_REVERSE_BITS = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


def ogg_crc(data: bytes) -> int:
    reflected = zlib.crc32(data.translate(_REVERSE_BITS), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def _lacing(size: int) -> bytes:
    """A packet's segment-table entries: 255s, then the remainder (0 if it divides evenly)."""
    return bytes([255] * (size // 255) + [size % 255])


class OggOpusEncoder(StreamEncoder):
    cpu_heavy = True

    def __init__(self, sample_rate_hz: int, bit_rate: int):
        import av  # PyAV: loaded with the first opus response

        self._av = av
        codec = av.CodecContext.create("libopus", "w")
        codec.sample_rate, codec.layout, codec.format = sample_rate_hz, "mono", "s16"
        codec.bit_rate = bit_rate
        codec.open()
        self._codec = codec
        self.sample_rate_hz = sample_rate_hz
        head = bytes(codec.extradata)  # the OpusHead libopus made (RFC 7845 section 5.1)
        self._pre_skip = struct.unpack_from("<H", head, 10)[0]
        self._sequence = 0
        self._granule = 0  # 48 kHz samples of every packet paged so far, pre-skip included
        self._samples_in = 0
        self._closed = False
        vendor = b"higgs-serve"
        tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)
        self._headers = self._page([head], 0, _BOS) + self._page([tags], 0, 0)

    def push(self, samples: np.ndarray) -> bytes:
        samples = np.asarray(samples, dtype=np.int16)
        out, self._headers = self._headers, b""
        if samples.size:
            frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[None, :]),
                                                     format="s16", layout="mono")
            frame.sample_rate = self.sample_rate_hz
            frame.pts = self._samples_in
            self._samples_in += samples.size
            out += self._pages(list(self._codec.encode(frame)), last=False)
        return out

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        out, self._headers = self._headers, b""
        packets = []
        if self._samples_in == 0:  # no audio at all: one silent frame, trimmed whole by the end
            packets += self._codec.encode(self._silent_frame())  # granule (a file of 0 samples)
        packets += self._codec.encode(None)
        return out + self._pages(packets, last=True)

    def _silent_frame(self):
        frame = self._av.AudioFrame.from_ndarray(
            np.zeros((1, self._codec.frame_size), np.int16), format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.sample_rate_hz, 0
        return frame

    def _pages(self, packets: list, last: bool) -> bytes:
        """Packets -> pages (a new page past 255 segments); the last page of the stream gets the
        end-of-stream flag and the exact end as its granule position."""
        out, page, segments = b"", [], 0
        for packet in packets:
            lacing = len(_lacing(packet.size))
            if page and segments + lacing > _MAX_SEGMENTS:
                out += self._page(page, self._granule, 0)
                page, segments = [], 0
            page.append(bytes(packet))
            segments += lacing
            self._granule += packet.duration * OPUS_GRANULE_RATE_HZ // self.sample_rate_hz
        if last:
            end = self._pre_skip + self._samples_in * OPUS_GRANULE_RATE_HZ // self.sample_rate_hz
            return out + self._page(page, min(end, self._granule) if page else end, _EOS)
        return out + (self._page(page, self._granule, 0) if page else b"")

    def _page(self, packets: list[bytes], granule: int, flags: int) -> bytes:
        table = b"".join(_lacing(len(p)) for p in packets)
        header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, _SERIAL, self._sequence,
                             0, len(table))
        self._sequence += 1
        page = bytearray(header + table + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc(bytes(page)))
        return bytes(page)
