"""The engine loop's hooks: `on_step` (metrics) after every step, `profile(phase)` around each
phase of a step, both passed in at build time (no attribute poked in afterwards)."""

from __future__ import annotations

import contextlib

from engine_harness import TEXTS, ManualEngine, engine_deploy, sampling, speech

from higgs_serve.engine.core import EngineHooks

FRAMES = 12


def test_hooks_see_every_step_and_each_phase_inside_it(tiny_loaded):
    steps: list[tuple[float, int, int]] = []
    events: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def profile(phase: str):
        events.append(("enter", phase))
        yield
        events.append(("exit", phase))

    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=2),
                          EngineHooks(on_step=lambda *args: steps.append(args), profile=profile))
    try:
        sinks = engine.generate([speech(f"h{i}", TEXTS[i], sampling(seed=i, frames=FRAMES)) for i in range(2)])
    finally:
        engine.close()
    assert all(s.finish_reason == "length" for s in sinks)
    # one on_step per collected step; their rows are every row the two requests produced
    assert len(steps) == engine.core.counters.steps
    assert sum(rows for _, _, rows in steps) == sum(len(s.rows) for s in sinks)
    assert all(seconds >= 0 and num_seqs >= 1 for seconds, num_seqs, _ in steps)
    # every step call is one "step" span; the others nest inside one, properly closed
    step_calls = events.count(("enter", "step"))
    assert step_calls == events.count(("exit", "step")) >= len(steps)
    assert events.count(("enter", "launch")) == events.count(("enter", "collect")) == len(steps)
    assert events.count(("enter", "outputs")) == events.count(("enter", "update")) == len(steps)
    assert events.count(("enter", "schedule")) == step_calls
    depth = 0
    for kind, phase in events:
        if phase == "step":
            depth += 1 if kind == "enter" else -1
            assert depth in (0, 1)
        else:
            assert depth == 1, (kind, phase)  # inside a step
