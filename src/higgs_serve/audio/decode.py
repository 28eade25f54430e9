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
"""

from __future__ import annotations

import io
import math

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


def read_clip(data: bytes, param: str, max_seconds: float,
              what: str = "reference audio") -> tuple[np.ndarray, int]:
    """File bytes -> ([n] float32 mono, its sample rate in Hz), at most `max_seconds` long
    (`what` names the audio in the refusal)."""
    if not data:
        raise InvalidRequestError(f"{param} is empty", param=param)
    demuxer = _container_demuxer(data)
    if demuxer is not None:
        mono, rate_hz = _read_with_av(data, demuxer, param, max_seconds, what)
    else:
        mono, rate_hz = _read_with_soundfile(data, param, max_seconds, what)
    if mono.size == 0:
        raise InvalidRequestError(f"{param} contains no audio samples", param=param)
    return mono, rate_hz


# Headerless encodings (our own pcm, ulaw and alaw outputs): the caller names the encoding and the
# rate, as nothing in the bytes says them. encoding -> the ffmpeg raw demuxer.
HEADERLESS = {"pcm": "s16le", "ulaw": "mulaw", "alaw": "alaw"}


def read_headerless(data: bytes, encoding: str, rate_hz: int, param: str, max_seconds: float,
                    what: str) -> tuple[np.ndarray, int]:
    """Mono headerless samples (16-bit little-endian pcm or G.711) at `rate_hz` -> ([n] float32,
    rate_hz), at most `max_seconds` long."""
    if encoding not in HEADERLESS:
        raise InvalidRequestError(f"unknown headerless encoding {encoding!r}; one of {', '.join(HEADERLESS)}",
                                  param=param)
    if not data:
        raise InvalidRequestError(f"{param} is empty", param=param)
    _check_header(param, rate_hz, 1, len(data) / rate_hz / (2 if encoding == "pcm" else 1), max_seconds, what)
    return _read_with_av(data, HEADERLESS[encoding], param, max_seconds, what,
                         options={"sample_rate": str(rate_hz), "ch_layout": "mono"})


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


# ----------------------------------------------------------------------------- soundfile
def _read_with_soundfile(data: bytes, param: str, max_seconds: float, what: str) -> tuple[np.ndarray, int]:
    try:
        handle = sf.SoundFile(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError) as error:
        raise UnreadableAudioError(
            f"{param} is not a supported audio file ({_name_format(data)}); accepted: {ACCEPTED}",
            param=param) from error
    with handle:
        rate_hz, channels = int(handle.samplerate), int(handle.channels)
        if handle.frames >= _SF_UNKNOWN_FRAMES and data.startswith(b"fLaC"):
            # a FLAC stream whose total_samples is 0 ("unknown"): libsndfile cannot read it
            # block by block (its position query fails), ffmpeg's FLAC decoder can
            return _read_with_av(data, "flac", param, max_seconds, what)
        # the header's frame count (0 when the header leaves it open); never trusted below:
        # decoding stops at the limit whatever the header says
        header_s = handle.frames / rate_hz if 0 < handle.frames and rate_hz > 0 else None
        _check_header(param, rate_hz, channels, header_s, max_seconds, what)
        out = _MonoBuffer(rate_hz, max_seconds, header_s, param, what)
        try:
            while True:
                block = handle.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
                if block.shape[0] == 0:
                    break
                out.append(block.mean(axis=1, dtype=np.float32))  # [frames, ch] -> [frames]
        except (sf.LibsndfileError, RuntimeError) as error:
            raise InvalidRequestError(f"{param} could not be decoded: the audio stream is damaged",
                                      param=param) from error
    return out.samples(), rate_hz


# ----------------------------------------------------------------------------- PyAV containers
def _container_demuxer(data: bytes) -> str | None:
    """The ffmpeg demuxer for the containers soundfile cannot read, by magic bytes; else None."""
    if data[4:8] == _FTYP:
        return "mov"  # mp4, m4a, 3gp
    if data[:4] == _EBML:
        return "matroska"  # webm, mkv
    if data[:4] == _ADIF or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xF6 == 0xF0):
        return "aac"  # ADIF or an ADTS frame sync (mp3's sync differs in the layer bits)
    if _is_layer3_sync(_past_id3(data)):
        return "mp3"  # an MPEG audio layer III frame sync, after an ID3 tag if any
    return None


def _past_id3(data: bytes) -> bytes:
    """The bytes after a leading ID3v2 tag (its size: 4 syncsafe bytes; a footer adds 10); an ID3
    tag may also lead a FLAC (a C2PA manifest's), so what follows it decides."""
    if data[:3] != _ID3 or len(data) < 10:
        return data
    size = (data[6] & 0x7F) << 21 | (data[7] & 0x7F) << 14 | (data[8] & 0x7F) << 7 | (data[9] & 0x7F)
    return data[10 + size + (10 if data[5] & 0x10 else 0):]


def _is_layer3_sync(data: bytes) -> bool:
    return len(data) > 1 and data[0] == 0xFF and data[1] & 0xE6 == 0xE2


def _read_with_av(data: bytes, demuxer: str, param: str, max_seconds: float, what: str,
                  options: dict[str, str] | None = None) -> tuple[np.ndarray, int]:
    import av  # PyAV: loaded with the first container soundfile cannot read, not at server import

    try:
        container = av.open(io.BytesIO(data), mode="r", format=demuxer, options=options or {})
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
        out = _MonoBuffer(rate_hz, max_seconds, header_s, param, what)
        try:
            _decode_av_frames(container, stream, rate_hz, param, out)
            return out.samples(), rate_hz
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


def _decode_av_frames(container, stream, rate_hz: int, param: str, out: _MonoBuffer) -> None:
    import av

    to_float = av.AudioResampler(format="fltp")  # any sample format -> planar float32
    for frame in container.decode(stream):
        # every frame is checked: a stream may change its layout or rate after the header
        _check_header(param, int(frame.rate or 0), int(frame.layout.nb_channels), None, 0.0)
        if frame.rate != rate_hz:
            raise InvalidRequestError(f"{param} changes its sample rate mid-stream", param=param)
        for planar in to_float.resample(frame):
            out.append(planar.to_ndarray().mean(axis=0, dtype=np.float32))  # [ch, n] -> [n]


class _MonoBuffer:
    """Decoded mono samples, preallocated once: the header's length when it gave one (grown if
    it lied short), else the limit; a block past the limit is refused before it is stored."""

    def __init__(self, rate_hz: int, max_seconds: float, header_s: float | None, param: str,
                 what: str = "reference audio"):
        self._limit = math.ceil(rate_hz * max_seconds)
        self._max_seconds, self._param, self._what = max_seconds, param, what
        guess = self._limit if header_s is None else min(self._limit, math.ceil(header_s * rate_hz))
        self._data = np.empty(max(guess, 1), dtype=np.float32)
        self._size = 0

    def append(self, block: np.ndarray) -> None:
        end = self._size + block.shape[0]
        if end > self._limit:
            raise InvalidRequestError(
                f"{self._param} is longer than {self._max_seconds:g} s; {self._what} may be at "
                f"most {self._max_seconds:g} s", param=self._param)
        if end > self._data.shape[0]:
            grown = np.empty(min(self._limit, max(end, 2 * self._data.shape[0])), np.float32)
            grown[:self._size] = self._data[:self._size]
            self._data = grown
        self._data[self._size:end] = block
        self._size = end

    def samples(self) -> np.ndarray:
        """[n] float32: a view (no copy, so the peak stays one buffer)."""
        return self._data[:self._size]


def _name_format(data: bytes) -> str:
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] != b"WAVE":
        return f"RIFF {data[8:12].decode('latin-1')!r}"
    return "unrecognised format"
