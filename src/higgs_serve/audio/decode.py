"""Bounded decoding of client audio (reference clips): header checks first, then block by block.

A compressed file can claim hours of audio, dozens of channels or a 1 Hz sample rate in a few
kilobytes; decoding it in full and checking afterwards lets one request take gigabytes. So:

1. open the file and read its header only (soundfile for wav/flac/ogg, PyAV for mp3 and the aac,
   m4a/mp4 and webm/mkv containers, chosen by the file's magic bytes, never by ffmpeg probing;
   mp3 goes to FFmpeg's decoder because libsndfile's libmpg123 prints its own complaints to the
   process's stderr, e.g. "part2_3_length ... too large" on files both decode to the same samples,
   and cannot be told not to; PyAV leaves FFmpeg's log off, so only our errors are seen);
2. refuse a rate outside [MIN_RATE_HZ, MAX_RATE_HZ], more than MAX_CHANNELS channels, or a
   header duration above the limit, before any sample is decoded;
3. decode in blocks of at most BLOCK_FRAMES frames, averaging each block to mono at once, and stop
   as soon as the decoded length passes the limit (headers can lie about their length);
4. resample to the model rate; the rate bounds bound the ratio (1/8 to 3 for 24 kHz), so the
   output is at most `max_seconds` at the model rate.

Peak memory is therefore about max_seconds x MAX_RATE_HZ x 4 bytes (23 MB for 30 s) plus one
block, whatever the file says. Every refusal is an InvalidRequestError naming `param`.

`open_clip` / `open_headerless` give the same decoding as blocks, for a reader that keeps less
than the whole clip (watermark detection: audio/watermark_detect.py); the source may be bytes or
a seekable binary file (an upload spooled to disk is never read into memory whole).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr

from higgs_serve.errors import InvalidRequestError, UnreadableAudioError

MIN_RATE_HZ = 8_000
MAX_RATE_HZ = 192_000
MAX_CHANNELS = 2
BLOCK_FRAMES = 65_536
_SF_UNKNOWN_FRAMES = 2**62  # libsndfile says SF_COUNT_MAX (2**63 - 1) for "unknown"
SOUNDFILE_FORMATS = "wav, flac, ogg/opus"
CONTAINER_FORMATS = "mp3, aac, m4a/mp4, webm/mkv"
ACCEPTED = f"{SOUNDFILE_FORMATS}, {CONTAINER_FORMATS}"

# magic bytes -> the PyAV demuxer that reads them (only these are ever handed to ffmpeg)
_FTYP, _EBML, _ADIF, _ID3 = b"ftyp", b"\x1a\x45\xdf\xa3", b"ADIF", b"ID3"
# magic bytes of formats we recognise but do not decode, so the 400 can name them
_OTHER_FORMATS = ((b"#!AMR", "amr"), (b"MThd", "midi"), (b"FORM", "aiff/iff"), (b".snd", "au"),
                  (b"OggS", "ogg with an unsupported codec"), (b"ID3", "mp3 with a damaged stream"),
                  (b"caff", "caf"), (b"wvpk", "wavpack"), (b"MAC ", "monkey's audio"))


@dataclass
class DecodedClip:
    """A clip being decoded: its rate (checked), the header's length when it gives one, and its
    mono float32 blocks; iterating raises InvalidRequestError past the length limit or on a
    damaged stream. Close it (or exhaust it) to free the decoder."""

    rate_hz: int
    header_s: float | None
    blocks: Iterator[np.ndarray]

    def close(self) -> None:
        self.blocks.close()


Source = bytes | BinaryIO


def open_clip(source: Source, param: str, max_seconds: float,
              what: str = "reference audio") -> DecodedClip:
    """A file (bytes, or a seekable binary file at its start), header checked, ready to decode."""
    source = _as_file(source)
    head = source.read(16)
    source.seek(0)
    if not head:
        raise InvalidRequestError(f"{param} is empty", param=param)
    demuxer = _container_demuxer(head) or _mp3_demuxer(source, head)
    if demuxer is not None:
        blocks = _av_blocks(source, demuxer, param, max_seconds, what)
    else:
        blocks = _soundfile_blocks(source, head, param, max_seconds, what)
    return _started(blocks, param, max_seconds, what)


def read_clip(data: bytes, param: str, max_seconds: float,
              what: str = "reference audio") -> tuple[np.ndarray, int]:
    """File bytes -> ([n] float32 mono, its sample rate in Hz), at most `max_seconds` long
    (`what` names the audio in the refusal)."""
    return _collect(open_clip(data, param, max_seconds, what), param, max_seconds, what)


# Headerless encodings (our own pcm, ulaw and alaw outputs): the caller names the encoding and the
# rate, as nothing in the bytes says them. encoding -> the ffmpeg raw demuxer.
HEADERLESS = {"pcm": "s16le", "ulaw": "mulaw", "alaw": "alaw"}


def open_headerless(source: Source, encoding: str, rate_hz: int, param: str, max_seconds: float,
                    what: str) -> DecodedClip:
    """Mono headerless samples (16-bit little-endian pcm or G.711) at `rate_hz`, checked by
    their size, ready to decode."""
    if encoding not in HEADERLESS:
        raise InvalidRequestError(f"unknown headerless encoding {encoding!r}; one of {', '.join(HEADERLESS)}",
                                  param=param)
    source = _as_file(source)
    size = source.seek(0, io.SEEK_END)
    source.seek(0)
    if not size:
        raise InvalidRequestError(f"{param} is empty", param=param)
    _check_header(param, rate_hz, 1, size / rate_hz / (2 if encoding == "pcm" else 1), max_seconds, what)
    blocks = _av_blocks(source, HEADERLESS[encoding], param, max_seconds, what,
                        options={"sample_rate": str(rate_hz), "ch_layout": "mono"})
    return _started(blocks, param, max_seconds, what)


def read_headerless(data: bytes, encoding: str, rate_hz: int, param: str, max_seconds: float,
                    what: str) -> tuple[np.ndarray, int]:
    """Mono headerless samples (16-bit little-endian pcm or G.711) at `rate_hz` -> ([n] float32,
    rate_hz), at most `max_seconds` long."""
    return _collect(open_headerless(data, encoding, rate_hz, param, max_seconds, what), param,
                    max_seconds, what)


def load_clip(data: bytes, param: str, rate_hz: int, min_seconds: float,
              max_seconds: float) -> np.ndarray:
    """File bytes -> [n] float32 mono at `rate_hz`, lasting min_seconds..max_seconds."""
    mono, source_rate_hz = read_clip(data, param, max_seconds)
    if source_rate_hz != rate_hz:
        mono = soxr.resample(mono, source_rate_hz, rate_hz).astype(np.float32, copy=False)
    duration_s = mono.shape[0] / rate_hz
    if not min_seconds <= duration_s <= max_seconds:
        raise InvalidRequestError(
            f"reference audio must last {min_seconds}-{max_seconds} s, got {duration_s:.2f} s",
            param=param)
    return mono


# ----------------------------------------------------------------------------- header checks
def _check_header(param: str, rate_hz: int, channels: int, seconds: float | None,
                  max_seconds: float, what: str = "reference audio") -> None:
    if not MIN_RATE_HZ <= rate_hz <= MAX_RATE_HZ:
        raise InvalidRequestError(
            f"{param} has a sample rate of {rate_hz} Hz; accepted: {MIN_RATE_HZ}-{MAX_RATE_HZ} Hz",
            param=param)
    if not 1 <= channels <= MAX_CHANNELS:
        raise InvalidRequestError(
            f"{param} has {channels} channels; accepted: mono or stereo", param=param)
    if seconds is not None and seconds > max_seconds:
        raise InvalidRequestError(
            f"{param} is {seconds:.2f} s long; {what} may be at most {max_seconds:g} s",
            param=param)


# ----------------------------------------------------------------------------- blocks
# The block generators below yield the checked header first, (rate_hz, header_s), then mono
# float32 blocks; `_started` takes the header and hands out the blocks with the length limit.
def _as_file(source: Source) -> BinaryIO:
    return io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source


def _started(blocks: Iterator, param: str, max_seconds: float, what: str) -> DecodedClip:
    try:
        rate_hz, header_s = next(blocks)
    except BaseException:
        blocks.close()
        raise
    return DecodedClip(rate_hz, header_s, _limited(blocks, rate_hz, param, max_seconds, what))


def _limited(blocks: Iterator[np.ndarray], rate_hz: int, param: str, max_seconds: float,
             what: str) -> Iterator[np.ndarray]:
    """The blocks, refused (InvalidRequestError) as soon as their total passes the limit."""
    limit, total = math.ceil(rate_hz * max_seconds), 0
    try:
        for block in blocks:
            total += block.shape[0]
            if total > limit:
                raise InvalidRequestError(
                    f"{param} is longer than {max_seconds:g} s; {what} may be at most {max_seconds:g} s",
                    param=param)
            yield block
    finally:
        blocks.close()


def _collect(clip: DecodedClip, param: str, max_seconds: float, what: str) -> tuple[np.ndarray, int]:
    out = _MonoBuffer(clip.rate_hz, max_seconds, clip.header_s)
    try:
        for block in clip.blocks:
            out.append(block)
    finally:
        clip.close()
    if out.size == 0:
        raise InvalidRequestError(f"{param} contains no audio samples", param=param)
    return out.samples(), clip.rate_hz


# ----------------------------------------------------------------------------- soundfile
def _soundfile_blocks(source: BinaryIO, head: bytes, param: str, max_seconds: float, what: str) -> Iterator:
    try:
        handle = sf.SoundFile(source)
    except (sf.LibsndfileError, RuntimeError, TypeError) as error:
        raise UnreadableAudioError(
            f"{param} is not a supported audio file ({_name_format(head)}); accepted: {ACCEPTED}",
            param=param) from error
    with handle:
        rate_hz, channels = int(handle.samplerate), int(handle.channels)
        if handle.frames >= _SF_UNKNOWN_FRAMES and head.startswith(b"fLaC"):
            # a FLAC stream whose total_samples is 0 ("unknown"): libsndfile cannot read it
            # block by block (its position query fails), ffmpeg's FLAC decoder can
            handle.close()
            source.seek(0)
            yield from _av_blocks(source, "flac", param, max_seconds, what)
            return
        # the header's frame count (0 when the header leaves it open); never trusted: decoding
        # stops at the limit whatever the header says (_limited)
        header_s = handle.frames / rate_hz if 0 < handle.frames and rate_hz > 0 else None
        _check_header(param, rate_hz, channels, header_s, max_seconds, what)
        yield rate_hz, header_s
        try:
            while True:
                block = handle.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
                if block.shape[0] == 0:
                    return
                yield block.mean(axis=1, dtype=np.float32)  # [frames, ch] -> [frames]
        except (sf.LibsndfileError, RuntimeError) as error:
            raise InvalidRequestError(f"{param} could not be decoded: the audio stream is damaged",
                                      param=param) from error


# ----------------------------------------------------------------------------- PyAV containers
def _container_demuxer(data: bytes) -> str | None:
    """The ffmpeg demuxer for the containers soundfile cannot read, by magic bytes; else None."""
    if data[4:8] == _FTYP:
        return "mov"  # mp4, m4a, 3gp
    if data[:4] == _EBML:
        return "matroska"  # webm, mkv
    if data[:4] == _ADIF or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xF6 == 0xF0):
        return "aac"  # ADIF or an ADTS frame sync (mp3's sync differs in the layer bits)
    return None


def _mp3_demuxer(source: BinaryIO, head: bytes) -> str | None:
    """"mp3" when an MPEG audio layer III frame sync starts the file, or follows its leading
    ID3v2 tag (its size: 4 syncsafe bytes; a footer adds 10); an ID3 tag may also lead a FLAC (a
    C2PA manifest's), so what follows the tag decides. The source is left at its start."""
    start = 0
    if head[:3] == _ID3 and len(head) >= 10:
        size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F)
        start = 10 + size + (10 if head[5] & 0x10 else 0)
    source.seek(start)
    sync = source.read(2)
    source.seek(0)
    return "mp3" if len(sync) == 2 and sync[0] == 0xFF and sync[1] & 0xE6 == 0xE2 else None


def _av_blocks(source: BinaryIO, demuxer: str, param: str, max_seconds: float, what: str,
               options: dict[str, str] | None = None) -> Iterator:
    import av  # PyAV: loaded with the first container soundfile cannot read, not at server import

    try:
        container = av.open(source, mode="r", format=demuxer, options=options or {})
    except (av.FFmpegError, ValueError) as error:
        raise UnreadableAudioError(f"{param} is not a readable {demuxer} file", param=param) from error
    with container:
        if not container.streams.audio:
            raise InvalidRequestError(f"{param} has no audio stream", param=param)
        stream = container.streams.audio[0]
        rate_hz = int(stream.codec_context.sample_rate or 0)
        channels = int(stream.codec_context.layout.nb_channels or 0)
        header_s = _stream_seconds(stream, container)
        _check_header(param, rate_hz, channels, header_s, max_seconds, what)
        yield rate_hz, header_s
        try:
            yield from _decode_av_frames(container, stream, rate_hz, param)
        except InvalidRequestError:
            raise
        except (av.FFmpegError, ValueError) as error:
            raise InvalidRequestError(f"{param} could not be decoded: the audio stream is damaged",
                                      param=param) from error


def _stream_seconds(stream, container) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1e6  # microseconds
    return None


def _decode_av_frames(container, stream, rate_hz: int, param: str) -> Iterator[np.ndarray]:
    import av

    to_float = av.AudioResampler(format="fltp")  # any sample format -> planar float32
    for frame in container.decode(stream):
        # every frame is checked: a stream may change its layout or rate after the header
        _check_header(param, int(frame.rate or 0), int(frame.layout.nb_channels), None, 0.0)
        if frame.rate != rate_hz:
            raise InvalidRequestError(f"{param} changes its sample rate mid-stream", param=param)
        for planar in to_float.resample(frame):
            yield planar.to_ndarray().mean(axis=0, dtype=np.float32)  # [ch, n] -> [n]


class _MonoBuffer:
    """Decoded mono samples, preallocated once: the header's length when it gave one (grown if
    it lied short), else the limit (`_limited` refuses a block past it before it arrives)."""

    def __init__(self, rate_hz: int, max_seconds: float, header_s: float | None):
        self._limit = math.ceil(rate_hz * max_seconds)
        guess = self._limit if header_s is None else min(self._limit, math.ceil(header_s * rate_hz))
        self._data = np.empty(max(guess, 1), dtype=np.float32)
        self.size = 0

    def append(self, block: np.ndarray) -> None:
        end = self.size + block.shape[0]
        if end > self._data.shape[0]:
            grown = np.empty(min(self._limit, max(end, 2 * self._data.shape[0])), np.float32)
            grown[:self.size] = self._data[:self.size]
            self._data = grown
        self._data[self.size:end] = block
        self.size = end

    def samples(self) -> np.ndarray:
        """[n] float32: a view (no copy, so the peak stays one buffer)."""
        return self._data[:self.size]


def _name_format(data: bytes) -> str:
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] != b"WAVE":
        return f"RIFF {data[8:12].decode('latin-1')!r}"
    return "unrecognised format"
