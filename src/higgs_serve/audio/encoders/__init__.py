"""Incremental encoders: int16 samples in, the bytes of a response format out, as they are made.

One interface for every format (docs/api.md#formats):

    push(samples: [n] int16) -> bytes    what the codec produced from them (maybe nothing yet)
    close() -> bytes                     the rest: the codec's buffered tail and the trailer
    patches() -> [(offset, bytes)]       after close: rewrites of bytes already returned

A stream sends what push and close return, in order, and ignores `patches`: that is one valid
file whose header cannot know the length (WAV sizes 0xFFFFFFFF, FLAC total samples 0). A file
(`seekable=True`) is the same encoder fed the same way, whose output is collected and then
patched where the container keeps a length or an index (WAV sizes, FLAC STREAMINFO, the mp3
LAME/Info frame). So a streamed and a whole file carry the same audio packets and cannot drift
apart; only what a header can say differs (for mp3 the file also has the Info frame, which
tells decoders the encoder delay and padding).

What each codec holds back until later samples or close (its lookahead): mp3 (LAME) about one
frame plus its 1105-sample delay, AAC 1024 priming samples plus a 1024-sample frame, Opus a
20 ms frame plus 6.5 ms, FLAC one 40 ms block; pcm, wav and G.711 nothing.
"""

from __future__ import annotations

import numpy as np

from higgs_serve.audio.encoders.base import Patch, StreamEncoder
from higgs_serve.audio.encoders.muxed import MuxedEncoder
from higgs_serve.audio.encoders.ogg_opus import OggOpusEncoder
from higgs_serve.audio.encoders.pcm import G711Encoder, PcmEncoder, WavEncoder

__all__ = ["Patch", "StreamEncoder", "open_encoder", "encode_whole", "apply_patches",
           "CPU_HEAVY_FORMATS"]

# Bit rates of the compressed formats (mono speech): near transparent for a 24 kHz voice.
MP3_BIT_RATE = 64_000
AAC_BIT_RATE = 64_000
OPUS_BIT_RATE = 32_000
# The formats whose encoder is a codec (`StreamEncoder.cpu_heavy`): the server encodes them away
# from its event loop (in encoder processes: server/last_mile/encode_pool.py); pcm, wav and G.711 cost a
# copy or a table lookup and stay in the server.
CPU_HEAVY_FORMATS = frozenset({"mp3", "aac", "flac", "opus"})


def open_encoder(response_format: str, sample_rate_hz: int, seekable: bool = False) -> StreamEncoder:
    """A fresh encoder of `response_format` at `sample_rate_hz` (checked by audio/formats.py).
    seekable: the output is collected into a file that `patches` will be applied to."""
    if response_format == "pcm":
        return PcmEncoder()
    if response_format == "wav":
        return WavEncoder(sample_rate_hz)
    if response_format in ("ulaw", "alaw"):
        return G711Encoder(response_format)
    if response_format == "opus":
        return OggOpusEncoder(sample_rate_hz, OPUS_BIT_RATE)
    if response_format == "mp3":
        # no ID3 tag: the stream starts with audio (a file gets the LAME/Info frame first)
        return MuxedEncoder("mp3", "libmp3lame", "s16", sample_rate_hz, seekable,
                            bit_rate=MP3_BIT_RATE, container_options={"id3v2_version": "0"})
    if response_format == "aac":
        return MuxedEncoder("adts", "aac", "fltp", sample_rate_hz, seekable, bit_rate=AAC_BIT_RATE)
    if response_format == "flac":
        # 40 ms blocks (the encoder's own 2304-sample blocks would hold 96 ms back), no 8 KiB
        # padding block
        return MuxedEncoder("flac", "flac", "s16", sample_rate_hz, seekable,
                            codec_options={"frame_size": str(sample_rate_hz // 25)},
                            container_options={"metadata_header_padding": "0"})
    raise ValueError(f"no encoder for {response_format!r}")


def apply_patches(data: bytearray, patches: list[Patch]) -> None:
    for offset, value in patches:
        data[offset:offset + len(value)] = value


def encode_whole(samples: np.ndarray, response_format: str, sample_rate_hz: int) -> bytes:
    """samples: [n] int16 -> one file (the encoder fed once, its patches applied)."""
    encoder = open_encoder(response_format, sample_rate_hz, seekable=True)
    data = bytearray(encoder.push(samples))
    data += encoder.close()
    apply_patches(data, encoder.patches())
    return bytes(data)
