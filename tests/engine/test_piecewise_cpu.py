"""The piecewise step (split at the attention kernels, padded to a token count) gives the same
rows as the plain eager step, on CPU where its pieces run without graphs.

Requests of different lengths (one a voice clone, whose reference rows enter through the static
reference-row buffer) arrive in waves with a small token budget, so the piecewise path serves
prefill chunks, mixed steps and decode batches, each padded up to a token count with rows that
write no K/V and sampled rows that go to the pad slot. The GPU test
(tests/gpu/test_graph_paths.py) replays the same pieces from captured graphs.
"""

from __future__ import annotations

import numpy as np
import pytest

from higgs_serve.engine import builder
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.voices.reference_encoder import reference_audio
from higgs_serve.worker.cuda_graphs import GraphPolicy, StepMode

from engine_harness import TEXTS, ManualEngine, engine_deploy, sampling, speech

PIECEWISE = GraphPolicy(full_decode=False, mlp=False, capture_sizes=(), piecewise_sizes=(3, 8, 16, 40))


def _requests(prefix: str):
    requests = [speech(f"{prefix}{i}", TEXTS[i % len(TEXTS)],
                       sampling(temperature=0.0 if i % 2 else 0.8, seed=50 + i, frames=10 + 3 * i))
                for i in range(5)]
    codes = np.random.default_rng(3).integers(0, 1024, size=(30, 8))  # any valid codes will do
    requests.append(SpeechRequest(f"{prefix}5", TEXTS[2], sampling(temperature=0.8, seed=55, frames=20),
                                  reference=reference_audio(codes)))
    return requests


def _run(engine: ManualEngine, prefix: str) -> dict[str, np.ndarray]:
    requests = _requests(prefix)
    sinks = [engine.submit(r) for r in requests[:4]]
    engine.steps(6)  # the rest arrive while the first ones decode: mixed steps
    sinks += [engine.submit(r) for r in requests[4:]]
    engine.run()
    engine.wait(sinks)
    return {s.request_id[len(prefix):]: s.rows for s in sinks}


@pytest.fixture(scope="module")
def eager_rows(tiny_loaded):
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, max_num_batched_tokens=24))
    try:
        return _run(engine, "e")
    finally:
        engine.close()


def test_piecewise_rows_equal_eager_rows(tiny_loaded, eager_rows, monkeypatch):
    monkeypatch.setattr(builder, "graph_policy", lambda deploy, device: PIECEWISE)
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, max_num_batched_tokens=24))
    try:
        rows = _run(engine, "p")
        modes = engine.core.runner.step_modes
    finally:
        engine.close()
    assert modes[StepMode.PIECEWISE] > 0 and modes[StepMode.EAGER] == 0, modes
    assert rows.keys() == eager_rows.keys()
    for rid, expected in eager_rows.items():
        assert len(expected) > 8
        np.testing.assert_array_equal(rows[rid], expected, err_msg=f"request {rid}")
