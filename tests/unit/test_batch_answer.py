"""server/last_mile/batch_answer.py: the batch's JSON, sent as it is read from the items' files, is
byte for byte the envelope pydantic writes with each item's audio in it, its Content-Length
is right, no piece holds more than one block of audio, and every file is freed after."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from higgs_serve.server.last_mile.audio_file import SPOOL_MEMORY_BYTES, collect_file
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.audio_workers import AudioWorkers
from higgs_serve.server.last_mile.batch_answer import BASE64_BLOCK_BYTES, BatchAnswer, BatchItem
from higgs_serve.server.schemas import BatchItemResult, SpeechBatchResponse, Usage

RATE = 24000


@pytest.fixture
def workers():
    pool = AudioWorkers(1, "higgs-encode")
    yield pool
    pool.shutdown()


async def _pcm_file(workers: AudioWorkers, num_samples: int):
    """A finished pcm AudioFile of num_samples samples (2 bytes each) of noise."""
    audio = np.random.default_rng(num_samples).uniform(-0.5, 0.5, num_samples).astype(np.float32)

    async def chunks():
        for start in range(0, num_samples, 4800):
            yield audio[start:start + 4800]

    return await collect_file(chunks(), AudioOut("pcm", RATE, RATE, 1.0, workers, seekable=True))


def _success(index: int) -> BatchItemResult:
    return BatchItemResult(index=index, status="success", audio_data="", media_type="audio/pcm",
                           sample_rate=RATE, finish_reason="stop",
                           usage=Usage(input_tokens=3, output_tokens=7, total_tokens=10))


async def _collect(answer: BatchAnswer) -> list[bytes]:
    return [piece async for piece in answer.body()]


def test_the_streamed_answer_is_the_envelope_with_every_file_in_it(workers):
    # sizes in bytes: empty, 2, 4 (each remainder mod 3), a block's edge, and one spilled to disk
    samples = [0, 1, 2, BASE64_BLOCK_BYTES // 2, SPOOL_MEMORY_BYTES + 12_345]
    files = [asyncio.run(_pcm_file(workers, n)) for n in samples]
    assert files[-1].on_disk and not files[1].on_disk
    datas = []
    for file in files:
        datas.append(file.read_all())
    error = BatchItemResult(index=2, status="error", error='a "quoted" "audio_data":"" message',
                            param="input", code="x", status_code=400)
    items = [BatchItem(_success(0), files[0]), BatchItem(_success(1), files[1]),
             BatchItem(error, None)] + [BatchItem(_success(i + 3), f) for i, f in
                                        enumerate(files[2:])]
    answer = BatchAnswer("speech-batch-test", items)
    pieces = asyncio.run(_collect(answer))

    expected_results = [item.result.model_copy() for item in items]
    for result, data in zip([r for r in expected_results if r.status == "success"], datas):
        result.audio_data = base64.b64encode(data).decode("ascii")
    expected = SpeechBatchResponse(id="speech-batch-test", results=expected_results, total=6,
                                   succeeded=5, failed=1).model_dump_json().encode()
    assert b"".join(pieces) == expected
    assert answer.size_bytes == len(expected)
    # no piece carries more than one block of audio: no item's audio is in memory whole
    assert max(map(len, pieces)) <= BASE64_BLOCK_BYTES * 4 // 3 + 1024
    assert all(file._file.closed for file in files)


def test_an_answer_never_sent_frees_its_files(workers):
    file = asyncio.run(_pcm_file(workers, SPOOL_MEMORY_BYTES))
    answer = BatchAnswer("speech-batch-x", [BatchItem(_success(0), file)])
    answer.discard()
    assert file._file.closed
