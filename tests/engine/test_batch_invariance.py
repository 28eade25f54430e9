"""Issue 3: a request's codes do not depend on what else runs beside it (docs/model.md#sampling).

Sixteen requests of different prompt lengths and frame caps, half greedy and half sampled with a
fixed seed at temperature 0.8, arrive in three waves while earlier ones are decoding. A small
token budget (32) forces chunked prefill beside running decodes. Each request's rows, frames and
audio must equal those of the same request run alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from higgs_serve.engine.async_engine import AsyncEngine
from higgs_serve.engine.deadlines.playback_clock import Playback

from engine_harness import CPU, TEXTS, ManualEngine, assert_same_output, engine_deploy, sampling, speech

NUM_REQUESTS = 16
# (step at which the wave is submitted, request indices)
WAVES = ((0, range(0, 6)), (8, range(6, 11)), (20, range(11, 16)))


def _request(i: int, prefix: str = "r"):
    greedy = i % 2 == 0
    params = sampling(temperature=0.0 if greedy else 0.8, seed=1000 + i, frames=12 + (i * 5) % 13)
    return speech(f"{prefix}{i}", TEXTS[i % len(TEXTS)], params)


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=16, max_num_batched_tokens=32))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def alone(engine):
    """Each request run by itself (nothing else in the engine)."""
    out = {}
    for i in range(NUM_REQUESTS):
        (res,) = engine.generate([_request(i, prefix="alone")])
        out[i] = res
    return out


def _assert_same(i, got, ref):
    assert got.finish_reason == ref.finish_reason, f"request {i}"
    np.testing.assert_array_equal(got.frames, ref.frames, err_msg=f"request {i}: frames differ")
    assert_same_output(got, ref, f"request {i}")  # rows, audio


def test_alone_outputs_are_well_formed(alone):
    for i, res in alone.items():
        frames_cap = _request(i).sampling.max_new_tokens
        assert res.rows.dtype == np.int64 and res.rows.shape == (frames_cap + 8, 8)
        assert res.frames.shape == (frames_cap, 8) and res.finish_reason == "length"
        assert len(res.audio) == frames_cap * 960
    # the test is not vacuous: seeds and prompts give different codes
    assert not np.array_equal(alone[1].frames[:20], alone[3].frames[:20])
    assert not np.array_equal(alone[0].frames[:20], alone[2].frames[:20])


def test_sixteen_concurrent_staggered_requests_match_alone(engine, alone):
    sinks = {}
    step = 0
    max_running = 0
    for at_step, indices in WAVES:
        engine.steps(at_step - step)
        step = at_step
        if at_step > 0:  # later waves really arrive while earlier requests are decoding
            assert engine.core.stats()["num_running"] > 0
        for i in indices:
            sinks[i] = engine.submit(_request(i))
    while engine.core.step():
        max_running = max(max_running, engine.core.scheduler.num_running)
    engine.wait(list(sinks.values()))
    assert max_running >= 12  # most of the 16 overlapped
    for i in range(NUM_REQUESTS):
        _assert_same(i, sinks[i], alone[i])


def test_same_seed_reproducible_and_seed_matters(engine, alone):
    again = engine.generate([_request(1), _request(3)])
    _assert_same(1, again[0], alone[1])
    frames = _request(1).sampling.max_new_tokens
    other_seed = speech("other", TEXTS[1], sampling(temperature=0.8, seed=77, frames=frames))
    (res,) = engine.generate([other_seed])
    assert not np.array_equal(res.rows, alone[1].rows)


def test_threaded_async_engine_matches_alone(tiny_model_dir, alone):
    """The real engine thread + asyncio front end, with requests arriving mid-run."""
    indices = (0, 1, 4, 7, 9, 12)

    async def main():
        deploy = engine_deploy(max_num_seqs=16, max_num_batched_tokens=32)
        eng = AsyncEngine(str(tiny_model_dir), deploy, CPU)
        await eng.start()
        try:
            first = [eng.generate(_request(i, prefix="a")) for i in indices[:3]]
            while eng.core.counters.steps < 10:  # the first wave is decoding
                await asyncio.sleep(0.005)
            assert eng.stats()["num_running"] > 0
            later = [eng.generate(_request(i, prefix="a")) for i in indices[3:]]

            async def drain(stream):
                return [chunk async for chunk in stream]

            outs = await asyncio.gather(*(drain(s) for s in first + later))
            stats = eng.stats()
        finally:
            await eng.shutdown()
        return outs, stats

    outs, stats = asyncio.run(main())
    for i, chunks in zip(indices, outs):
        assert chunks[-1].is_final and chunks[-1].finish_reason == "length"
        audio = np.concatenate([c.audio for c in chunks])
        ref = alone[i].audio
        np.testing.assert_allclose(audio, ref, rtol=0, atol=1e-5 * float(np.max(np.abs(ref))),
                                   err_msg=f"request {i}")
    assert stats["free_kv_blocks"] == stats["total_kv_blocks"] - 1  # block 0 is never handed out


def test_streams_that_sit_out_steps_match_alone(engine, alone):
    """Issue 53: the deadline policy may leave a running stream out of a step
    (engine/deadlines/slack_policy.py); its codes must not change. The policy's own choice is
    narrowed further, deterministically, so every request sits out steps while the others run;
    the requests are streams (playback clocks, deadlines to the codec) and their rows and frames
    must equal those of each request alone."""
    policy = engine.core.scheduler.policy
    choose = policy.choose_decodes  # the policy's own choice, narrowed below
    calls, sat_out = [0], {}

    def sitting_out(decodes, num_streams):
        chosen = choose(decodes, num_streams)
        calls[0] += 1
        kept = [r for k, r in enumerate(chosen) if (calls[0] + k) % 3 or len(chosen) == 1]
        for request in chosen:
            if request not in kept:
                sat_out[request.request_id] = sat_out.get(request.request_id, 0) + 1
        return kept

    policy.choose_decodes = sitting_out
    policy._one_more_fits = lambda running, candidate: True  # admission wide open: all overlap
    try:
        sinks = {}
        step = 0
        for at_step, indices in WAVES:
            engine.steps(at_step - step)
            step = at_step
            for i in indices:
                request = replace(_request(i, prefix="skip"), stream=True, playback=Playback())
                sinks[i] = engine.submit(request)
        engine.run()
        engine.wait(list(sinks.values()))
    finally:
        del policy.choose_decodes, policy._one_more_fits  # the class's methods again
    assert len(sat_out) >= 12 and min(sat_out.values()) >= 2  # most sat out steps, repeatedly
    for i in range(NUM_REQUESTS):
        got, ref = sinks[i], alone[i]
        assert got.finish_reason == ref.finish_reason, f"request {i}"
        np.testing.assert_array_equal(got.rows, ref.rows, err_msg=f"request {i}: rows differ")
        np.testing.assert_array_equal(got.frames, ref.frames, err_msg=f"request {i}: frames differ")
        assert len(got.audio) == len(ref.audio)
