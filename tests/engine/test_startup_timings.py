"""Issue 59: what the engine times at start-up for the deadline policy (engine/builder.py
`time_for_deadlines`, worker/step_timing.py): every decode batch size it may run and a prompt
token, and Stage 1's calls of 1 to its cap of windows; the policy starts from them; and the
timing leaves nothing behind: the first requests get the same rows as on an engine that timed
nothing, and the step counters start at zero."""

from engine_harness import ManualEngine, engine_deploy, assert_same_output, sampling, speech

from higgs_serve.engine.deadlines.startup_timings import StartupTimings


def test_the_engine_starts_from_its_own_timings_and_they_leave_nothing_behind(tiny_loaded, monkeypatch):
    from higgs_serve.engine import builder

    seen: list[StartupTimings] = []
    timed = builder.time_for_deadlines
    monkeypatch.setattr(builder, "time_for_deadlines", lambda *a: seen.append(timed(*a)) or seen[-1])
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=6, watermark=True))
    plain = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=6, watermark=True, deadlines=False))
    try:
        (timings,) = seen  # the policy-off engine timed nothing
        assert sorted(timings.decode_us) == [1, 2, 4, 6]  # the capture sizes up to 6, and 6
        assert all(us > 0 for us in timings.decode_us.values()) and timings.token_us > 0
        assert [sorted(curve) for curve in timings.stage1_ppm] == [[1], [1]]  # codec, mark: one window a call on CPU
        policy = engine.core.scheduler.policy
        assert policy.model.seeded and policy.limit.limit == policy.predicted_capacity(())
        assert not any(engine.core.runner.step_modes.values())  # serving's counts start at zero
        requests = [speech(f"r{i}", text, sampling(temperature=0.8, seed=i, frames=20))
                    for i, text in enumerate(("Hi", "Hello there.", "The cat sat on the mat."))]
        for got, ref in zip(engine.generate(requests), plain.generate(requests)):
            assert_same_output(got, ref, got.request_id)
    finally:
        engine.close()
        plain.close()
