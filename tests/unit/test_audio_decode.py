"""audio/decode.py: header checks before decoding, bounded block decoding, PyAV containers."""

from __future__ import annotations

import io
import sys
import tracemalloc
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from higgs_serve.audio.decode import load_clip, read_clip
from higgs_serve.errors import InvalidRequestError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from bombs import flac_without_length, silent_flac, wav_with_lying_length, wav_with_rate  # noqa: E402

RATE = 24000


def _tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return np.repeat(mono[:, None], channels, axis=1) if channels > 1 else mono


def _sf_bytes(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format=fmt)
    return buffer.getvalue()


def _av_bytes(seconds: float, rate: int, channels: int, container: str, codec: str) -> bytes:
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[channels]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        audio = np.tile(_tone(seconds, rate)[None, :], (channels, 1))
        frame = av.AudioFrame.from_ndarray(audio, format="fltp", layout=layout)
        frame.rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def _refused(data: bytes, words: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        load_clip(data, "ref_audio", RATE, 0.5, 30.0)
    assert caught.value.param == "ref_audio"
    assert words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG", "MP3"])
def test_soundfile_formats_decode_to_mono_at_the_model_rate(fmt):
    clip = load_clip(_sf_bytes(_tone(1.0, 16000, channels=2), 16000, fmt), "ref_audio", RATE,
                     0.5, 30.0)
    assert clip.dtype == np.float32 and clip.ndim == 1
    assert abs(clip.shape[0] / RATE - 1.0) < 0.1


@pytest.mark.parametrize("container,codec", [("mp4", "aac"), ("ipod", "aac"), ("adts", "aac"),
                                             ("webm", "libopus"), ("matroska", "aac")])
def test_containers_decode_through_pyav(container, codec):
    rate = 48000 if codec == "libopus" else 44100
    clip = load_clip(_av_bytes(1.0, rate, 2, container, codec), "ref_audio", RATE, 0.5, 30.0)
    assert abs(clip.shape[0] / RATE - 1.0) < 0.1
    assert 0.1 < float(np.abs(clip).max()) < 0.5  # the tone, downmixed, not silence or clipping


def test_mp3_goes_to_ffmpegs_decoder_and_an_id3_tag_is_looked_past(monkeypatch):
    """mp3 (libsndfile's libmpg123 prints its own lines to stderr: tests/server/test_detect_messages.py)
    is read by PyAV, also behind an ID3 tag; a FLAC behind an ID3 tag stays with soundfile."""
    import higgs_serve.audio.decode as decode

    tag = b"ID3\x04\x00\x00\x00\x00\x00\x05" + b"\x00" * 5  # an ID3v2.4 tag of 5 bytes
    mp3 = _sf_bytes(_tone(1.0, 24000), 24000, "MP3")
    flac = _sf_bytes(_tone(1.0, 24000), 24000, "FLAC")
    def demuxer(data: bytes) -> str | None:
        return decode._container_demuxer(data) or decode._mp3_demuxer(io.BytesIO(data), data[:16])

    assert [demuxer(d) for d in (mp3, tag + mp3, tag + flac)] == ["mp3", "mp3", None]
    monkeypatch.setattr(decode.sf, "SoundFile", None)  # soundfile is not asked
    for data in (mp3, tag + mp3):
        clip = load_clip(data, "ref_audio", RATE, 0.5, 30.0)
        assert abs(clip.shape[0] / RATE - 1.0) < 0.1


def test_header_checks_refuse_before_decoding():
    _refused(wav_with_rate(1, 10_000), "sample rate of 1 Hz")
    _refused(wav_with_rate(1_000_000, 10_000), "sample rate of 1000000 Hz")
    _refused(silent_flac(5, channels=8), "8 channels")
    _refused(silent_flac(600, channels=1, rate_hz=8000), "600.00 s long")
    _refused(_av_bytes(1.0, 48000, 6, "mp4", "aac"), "6 channels")
    _refused(_av_bytes(31.0, 16000, 1, "mp4", "aac"), "may be at most 30 s")


def test_an_unknown_length_stops_decoding_at_the_limit():
    _refused(wav_with_lying_length(40.0), "40.00 s")  # libsndfile measures the data itself
    _refused(flac_without_length(40.0), "longer than 30 s")
    assert load_clip(flac_without_length(2.0), "ref_audio", RATE, 0.5, 30.0).shape[0] == 2 * RATE
    assert load_clip(wav_with_lying_length(2.0), "ref_audio", RATE, 0.5, 30.0).shape[0] == 2 * RATE


def test_peak_memory_of_a_bomb_stays_small():
    """An 8-channel clip within the header limits decodes block by block: peak ~ the mono output."""
    data = silent_flac(30, channels=2, rate_hz=192000)  # 30 s stereo at 192 kHz: 46 MB as float32
    tracemalloc.start()
    try:
        read_clip(data, "ref_audio", 30.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40e6, peak  # mono output (23 MB) + one block, never the stereo float array


def test_unsupported_formats_are_named():
    _refused(b"#!AMR\n" + bytes(100), "(amr)")
    _refused(b"MThd" + bytes(100), "(midi)")
    _refused(b"not audio at all", "unrecognised format")
    _refused(b"", "is empty")
