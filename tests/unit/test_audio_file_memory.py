"""Issue 61 item 3, in small: a whole WAV file (`stream: false`) built chunk by chunk of 40 ms is
spooled to a temporary file past SPOOL_MEMORY_BYTES instead of held on the heap (its Python heap
at its peak is the same for 120 s as for 30 s of audio, well under 0.2 KB a frame more), and it
stays whole: every sample, the RIFF and data sizes in its header patched to its length. The RSS
of a 100,000-character request on the real server is benchmarks/limits/bench_file_memory.py's."""

from __future__ import annotations

import asyncio
import io
import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from higgs_serve.server.last_mile.audio_file import SPOOL_MEMORY_BYTES, collect_file
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.audio_workers import AudioWorkers

RATE = 24_000
FRAME = 960  # 40 ms


@pytest.fixture
def workers():
    pool = AudioWorkers(1, "higgs-encode")
    yield pool
    pool.shutdown()


def _file_of(frames: int, workers: AudioWorkers) -> tuple[bytes, bool, int]:
    """(the finished WAV's bytes, whether it was on disk, the traced heap's peak growth while it
    was made)."""
    audio = (0.3 * np.sin(np.arange(frames * FRAME) * 2 * np.pi * 220 / RATE)).astype(np.float32)

    async def chunks():
        for start in range(0, audio.size, FRAME):
            yield audio[start:start + FRAME]

    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        file = asyncio.run(collect_file(chunks(), AudioOut("wav", RATE, RATE, 1.0, workers, seekable=True)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        return file.read_all(), file.on_disk, peak - start
    finally:
        file.discard()


def test_a_long_wav_file_is_on_disk_and_whole(workers):
    data, on_disk, _ = _file_of(250, workers)  # 10 s, 480 KB: in memory
    assert not on_disk and len(data) == 44 + 250 * FRAME * 2
    short, long_frames = 750, 3000  # 30 s (1.4 MB) and 120 s (5.8 MB): on disk
    data, on_disk, _ = _file_of(long_frames, workers)
    assert on_disk and len(data) == 44 + long_frames * FRAME * 2 > SPOOL_MEMORY_BYTES
    assert int.from_bytes(data[4:8], "little") == len(data) - 8 and data[36:40] == b"data"
    assert int.from_bytes(data[40:44], "little") == long_frames * FRAME * 2
    assert sf.info(io.BytesIO(data)).frames == long_frames * FRAME
    _, short_on_disk, short_peak = _file_of(short, workers)
    _, _, long_peak = _file_of(long_frames, workers)
    assert short_on_disk
    # 4x the audio, no more heap: the extra frames cost less than 0.2 KB each
    assert long_peak - short_peak < 0.2 * 1024 * (long_frames - short), (short_peak, long_peak)
    assert long_peak < 3 * SPOOL_MEMORY_BYTES  # the spool's memory part and its move to disk
