"""server/last_mile/audio_out.py and server/last_mile/audio_file.py: the per-response pipeline and the whole-file
path (spooled: memory up to 1 MiB, then a temporary file)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from support.decoders import av_decode

from higgs_serve.audio.encoders import encode_whole
from higgs_serve.audio.formats import float_to_int16
from higgs_serve.audio.output_rate import resample
from higgs_serve.audio.time_stretch import time_stretch
from higgs_serve.server.last_mile.audio_file import SPOOL_MEMORY_BYTES, collect_file
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.audio_workers import AudioWorkers

RATE = 24000


def _audio(seconds: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


async def _chunks(audio: np.ndarray, size: int = 960 * 5):
    for i in range(0, audio.size, size):
        yield audio[i:i + size]


@pytest.fixture
def workers():
    pool = AudioWorkers(2, "higgs-encode")
    yield pool
    pool.shutdown()


@pytest.mark.parametrize("fmt, speed, rate", [("wav", 1.0, 24000), ("flac", 1.5, 16000),
                                              ("pcm", 0.8, 48000)])
def test_the_pipeline_chunk_by_chunk_is_the_whole_signal_rendered_once(workers, fmt, speed, rate):
    """Stretch, resample, convert, encode as chunks arrive == the same stages on the whole signal
    (lossless formats: identical samples)."""
    audio = _audio(2.3)
    file = asyncio.run(collect_file(_chunks(audio), AudioOut(fmt, RATE, rate, speed, workers,
                                                             seekable=True)))
    data = file.read_all()
    file.discard()
    whole = float_to_int16(resample(time_stretch(audio, speed), RATE, rate))
    assert np.array_equal(av_decode(data, fmt, rate), whole)
    if fmt != "pcm":
        assert data == encode_whole(whole, fmt, rate)


def test_codecs_encode_off_the_event_loop_and_pcm_on_it(workers):
    threads = {}

    async def run(fmt: str) -> None:
        out = AudioOut(fmt, RATE, RATE, 1.0, workers)
        out.taps.append(lambda audio: threads.setdefault(fmt, threading.current_thread().name))
        await out.push(_audio(0.2))
        await out.close()

    for fmt in ("mp3", "opus", "aac", "flac", "pcm", "wav", "ulaw"):
        asyncio.run(run(fmt))
    assert all(threads[f].startswith("higgs-encode") for f in ("mp3", "opus", "aac", "flac"))
    assert threads["pcm"] == threads["wav"] == threads["ulaw"] == threading.main_thread().name


def test_a_long_file_spills_to_disk_and_reads_back_whole(workers):
    audio = _audio(30.0)  # 1.44 MB of 24 kHz WAV
    file = asyncio.run(collect_file(_chunks(audio, RATE), AudioOut("wav", RATE, RATE, 1.0,
                                                                    workers, seekable=True)))
    assert file.on_disk and file.size_bytes == 44 + audio.size * 2 > SPOOL_MEMORY_BYTES

    async def read() -> bytes:
        return b"".join([block async for block in file.blocks()])

    data = asyncio.run(read())  # the body iterator closes (discards) the file at its end
    assert data == encode_whole(float_to_int16(audio), "wav", RATE)
    assert file._file.closed


def test_a_failed_collection_discards_its_file(workers, monkeypatch):
    from higgs_serve.server.last_mile.audio_file import AudioFile

    discarded = []
    original = AudioFile.discard
    monkeypatch.setattr(AudioFile, "discard", lambda self: (discarded.append(self), original(self)))

    async def failing():
        yield _audio(0.1)
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError):
        asyncio.run(collect_file(failing(), AudioOut("wav", RATE, RATE, 1.0, workers,
                                                     seekable=True)))
    assert len(discarded) == 1 and discarded[0]._file.closed
