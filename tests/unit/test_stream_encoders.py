"""audio/encoders: every format encoded incrementally decodes whole with real decoders
(FFmpeg's libraries through PyAV, soundfile), streamed and collected files carry the same audio,
and bytes leave with the chunk that made them (docs/api.md#formats)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from support.decoders import CODEC_FRAME, STREAM_DELAY, av_decode, soundfile_decode

from higgs_serve.audio.encoders import apply_patches, encode_whole, open_encoder
from higgs_serve.audio.encoders.ogg_opus import ogg_crc
from higgs_serve.audio.encoders.pcm import wav_header
from higgs_serve.audio.formats import FORMATS

LOSSY = ("mp3", "opus", "aac")
# soundfile (libsndfile 1.2.2) has no AAC, and cannot open a FLAC whose STREAMINFO does not
# know its length (a stream's); G.711 and pcm are headerless
SOUNDFILE_READS_STREAM = ("wav", "mp3", "opus")
SOUNDFILE_READS_FILE = ("wav", "flac", "mp3", "opus")


def _speechlike(rate_hz: int, seconds: float, seed: int = 0) -> np.ndarray:
    """[n] int16: a few harmonics with a wobbling pitch, plus a little noise."""
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    pitch = 140 + 30 * np.sin(2 * np.pi * 1.3 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate_hz
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    noise = np.random.default_rng(seed).standard_normal(t.size) * 0.02
    return (np.clip(0.3 * voice + noise, -1, 1) * 32767 * 0.8).astype(np.int16)


def _stream(fmt: str, rate_hz: int, samples: np.ndarray, chunk: int, seekable: bool = False):
    encoder = open_encoder(fmt, rate_hz, seekable=seekable)
    pieces = [encoder.push(samples[i:i + chunk]) for i in range(0, samples.size, chunk)]
    pieces.append(encoder.close())
    return pieces, encoder


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_streamed_and_collected_files_decode_whole_and_agree(fmt):
    rate = 24000 if fmt not in ("ulaw", "alaw") else 8000
    samples = _speechlike(rate, 1.37)  # not a whole number of any codec frame
    pieces, _ = _stream(fmt, rate, samples, chunk=rate // 25 * 3)  # 120 ms chunks
    streamed = b"".join(pieces)
    whole = encode_whole(samples, fmt, rate)
    from_stream = av_decode(streamed, fmt, rate)
    from_file = av_decode(whole, fmt, rate)
    if FORMATS[fmt].lossless:
        assert np.array_equal(from_stream, samples) and np.array_equal(from_file, samples)
    elif fmt in ("ulaw", "alaw"):  # 8-bit companding: the same length, within its step
        assert from_stream.size == samples.size and np.array_equal(from_stream, from_file)
        step = np.abs(samples.astype(np.int32)) // 16 + 32
        assert np.all(np.abs(from_stream.astype(np.int32) - samples) <= step)
    else:  # lossy: one codec frame of padding at most, beyond the delay a stream cannot carry
        frame = CODEC_FRAME[fmt](rate)
        extra = from_stream.size - samples.size - STREAM_DELAY[fmt]
        assert 0 <= extra < frame, (fmt, from_stream.size, samples.size)
    if fmt in SOUNDFILE_READS_STREAM:
        decoded, decoded_rate = soundfile_decode(streamed)
        assert decoded_rate == rate
        if FORMATS[fmt].lossless:
            assert np.array_equal(decoded, samples)
        else:
            assert 0 <= decoded.size - samples.size - STREAM_DELAY[fmt] < CODEC_FRAME[fmt](rate)
    if fmt in SOUNDFILE_READS_FILE:
        decoded, _ = soundfile_decode(whole)
        # the file's header knows the length: mp3's LAME frame lets decoders trim delay and padding
        assert decoded.size == samples.size
        if FORMATS[fmt].lossless:
            assert np.array_equal(decoded, samples)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_file_is_the_stream_with_its_header_patched(fmt):
    """The same encoder fed the same chunks: a file's bytes are the stream's, its header patched
    (mp3: the LAME/Info frame goes first, which a stream cannot fill in)."""
    samples = _speechlike(24000, 0.8)
    streamed = b"".join(_stream(fmt, 24000, samples, chunk=960)[0])
    pieces, encoder = _stream(fmt, 24000, samples, chunk=960, seekable=True)
    collected = bytearray(b"".join(pieces))
    apply_patches(collected, encoder.patches())
    if fmt == "mp3":
        info = bytes(collected[:len(collected) - len(streamed)])
        assert b"Info" in info or b"Xing" in info
        assert bytes(collected[len(info):]) == streamed
        return
    offsets = {offset: len(value) for offset, value in encoder.patches()}
    assert set(offsets) == {"wav": {0}, "flac": {8}}.get(fmt, set())
    assert len(collected) == len(streamed)
    changed = [i for i in range(len(streamed)) if collected[i] != streamed[i]]
    assert all(any(o <= i < o + n for o, n in offsets.items()) for i in changed)
    if fmt in ("wav", "flac"):  # chunking changes nothing in a lossless file
        assert bytes(collected) == encode_whole(samples, fmt, 24000)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_bytes_leave_with_the_chunks_that_made_them(fmt):
    """After one second of 40 ms chunks every format has sent audio, not just a header: what a
    codec holds back is its lookahead (audio/encoders docstring), never the stream."""
    rate = 24000
    samples = _speechlike(rate, 1.0)
    encoder = open_encoder(fmt, rate)
    sent = [len(encoder.push(samples[i:i + 960])) for i in range(0, samples.size, 960)]
    header = {"wav": 44, "opus": 0}.get(fmt, 0)
    assert sum(sent) > header + 1000, (fmt, sent)
    assert sum(1 for size in sent[-10:] if size) >= 5  # still flowing, chunk by chunk
    encoder.close()


def test_wav_stream_header_and_file_header():
    header = wav_header(24000)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", header[4:8])[0] == struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF
    samples = _speechlike(24000, 0.2)
    whole = encode_whole(samples, "wav", 24000)
    assert struct.unpack("<I", whole[40:44])[0] == samples.size * 2
    assert struct.unpack("<I", whole[4:8])[0] == samples.size * 2 + 36


def test_g711_matches_the_standard_companding():
    samples = np.array([0, 1, -1, 100, -100, 1000, -1000, 32767, -32768], np.int16)
    ulaw = open_encoder("ulaw", 8000).push(samples)
    alaw = open_encoder("alaw", 8000).push(samples)
    # G.711 tables: µ-law silence is 0xFF, A-law's is 0xD5; full scale is 0x80 / 0xAA
    assert ulaw[0] == 0xFF and alaw[0] == 0xD5
    assert ulaw[7] == 0x80 and alaw[7] == 0xAA
    assert len(ulaw) == len(alaw) == samples.size


def _ogg_crc_by_the_book(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def test_ogg_crc_is_the_specs():
    for data in (b"", b"OggS", bytes(range(256)), np.random.default_rng(3).bytes(1000)):
        assert ogg_crc(data) == _ogg_crc_by_the_book(data)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_an_empty_response_is_empty_or_a_valid_empty_file(fmt):
    rate = FORMATS[fmt].default_rate_hz or 24000
    encoder = open_encoder(fmt, rate)
    data = encoder.push(np.zeros(0, np.int16)) + encoder.close()
    if fmt in ("mp3", "aac", "pcm", "ulaw", "alaw"):  # no header: nothing to send
        assert data == b""
        return
    assert av_decode(data, fmt, rate).size == 0
    if fmt in SOUNDFILE_READS_STREAM:
        assert soundfile_decode(data)[0].size == 0


@pytest.mark.parametrize("fmt,rate", [("opus", 8000), ("opus", 48000), ("mp3", 8000),
                                      ("mp3", 44100), ("aac", 11025), ("flac", 48000),
                                      ("ulaw", 16000)])
def test_other_rates_decode_at_their_rate(fmt, rate):
    samples = _speechlike(rate, 0.5)
    decoded = av_decode(b"".join(_stream(fmt, rate, samples, rate // 10)[0]), fmt, rate)
    extra = decoded.size - samples.size - STREAM_DELAY.get(fmt, 0)
    assert 0 <= extra < (CODEC_FRAME[fmt](rate) if fmt in LOSSY else 1)
