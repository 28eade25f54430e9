"""Issue 3: aborting a request frees its slot and KV blocks and leaves the others untouched."""

from __future__ import annotations

import asyncio

import pytest
from engine_harness import CPU, TEXTS, ManualEngine, assert_same_output, engine_deploy, sampling, speech

from higgs_serve.engine.async_engine import AsyncEngine

FRAMES = 30


def _req(request_id: str, i: int):
    return speech(request_id, TEXTS[i], sampling(temperature=0.8 if i % 2 else 0.0, seed=40 + i, frames=FRAMES))


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, max_num_batched_tokens=32))
    yield eng
    eng.close()


def _worst_case_blocks(engine, sink_request) -> int:
    request = engine.core.scheduler.requests[sink_request]
    return engine.kv.num_blocks_for(request.max_num_tokens)


def test_abort_running_request_frees_blocks_and_keeps_others(engine):
    kv = engine.kv
    reference = engine.generate([_req(f"ref{i}", i) for i in (1, 3, 5)])
    sinks = [engine.submit(_req(f"run{i}", i)) for i in (1, 2, 3, 5)]
    engine.steps(12)  # all four admitted and decoding
    assert engine.core.stats()["num_running"] == 4
    victim = sinks[1]
    victim_blocks = _worst_case_blocks(engine, victim.request_id)
    free_before = kv.num_free_blocks
    engine.core.abort(victim.request_id)
    # freed at once (reserved and taken blocks alike), before the next step runs
    assert kv.num_free_blocks == free_before + victim_blocks
    assert victim.request_id not in engine.core.scheduler.requests
    assert victim.chunks[-1].is_final and victim.chunks[-1].finish_reason == "abort"
    assert victim.rows is None  # never finished
    engine.core.abort(victim.request_id)  # idempotent
    engine.core.abort("no-such-request")
    engine.run()
    survivors = [sinks[0], sinks[2], sinks[3]]
    engine.wait(survivors)
    for got, ref in zip(survivors, reference):
        assert_same_output(got, ref, got.request_id)
    assert sum(c.is_final for c in victim.chunks) == 1  # nothing arrives after the abort chunk
    assert kv.num_free_blocks == kv.num_usable_blocks  # all blocks free (cached-free included)
    stats = engine.core.stats()
    assert stats["num_running"] == stats["num_waiting"] == stats["num_active"] == 0


def test_abort_waiting_request_and_reuse_of_freed_slot(engine):
    (reference,) = engine.generate([_req("ref7", 7)])
    sinks = [engine.submit(_req(f"w{i}", i)) for i in range(5)]  # max_num_seqs 4: one waits
    engine.steps(3)
    assert engine.core.stats()["num_waiting"] == 1
    engine.core.abort(sinks[4].request_id)
    assert engine.core.stats()["num_waiting"] == 0
    assert sinks[4].chunks[-1].finish_reason == "abort"
    engine.steps(3)
    engine.core.abort(sinks[0].request_id)  # frees a slot mid-run ...
    late = engine.submit(_req("late7", 7))  # ... which a new request takes over
    engine.run()
    engine.wait([*sinks[1:4], late])
    assert_same_output(late, reference, "request admitted into a freed slot")
    assert engine.kv.num_free_blocks == engine.kv.num_usable_blocks


def test_closing_an_async_stream_aborts_the_request(tiny_model_dir):
    async def main():
        eng = AsyncEngine(str(tiny_model_dir), engine_deploy(max_num_seqs=4), CPU)
        await eng.start()
        try:
            long = eng.generate(speech("long", TEXTS[3], sampling(frames=250), stream=True))
            other = eng.generate(speech("other", TEXTS[2], sampling(frames=FRAMES), stream=True))
            first = await long.__anext__()  # streaming has started
            assert not first.is_final
            await long.aclose()  # the client went away
            chunks = [c async for c in other]
            for _ in range(200):  # the abort takes effect within a step
                if eng.stats()["num_active"] == 0:
                    break
                await asyncio.sleep(0.01)
            return chunks, eng.stats(), eng.core.counters.frames_generated
        finally:
            await eng.shutdown()

    chunks, stats, frames_generated = asyncio.run(main())
    assert chunks[-1].is_final and chunks[-1].finish_reason == "length"
    assert sum(c.num_frames for c in chunks) == FRAMES
    assert stats["num_active"] == stats["num_running"] == 0
    assert stats["free_kv_blocks"] == stats["total_kv_blocks"] - 1
    assert frames_generated < 150  # the long request stopped early (alone it would give >= 250 rows)
