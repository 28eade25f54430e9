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
from higgs_serve.worker.attention.selector import get_backend
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher, CudaGraphMode
from higgs_serve.worker.model_runner import KVCacheSpec, ModelRunner

from engine_harness import TEXTS, ManualEngine, engine_deploy, sampling, speech

PIECEWISE = CudaGraphDispatcher(CudaGraphMode.PIECEWISE, piecewise_sizes=(3, 8, 16, 40))


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
    monkeypatch.setattr(builder, "graph_dispatcher", lambda deploy, device: PIECEWISE)
    engine = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, max_num_batched_tokens=24))
    try:
        rows = _run(engine, "p")
        modes = engine.core.runner.step_modes
    finally:
        engine.close()
    assert modes[CudaGraphMode.PIECEWISE] > 0 and modes[CudaGraphMode.NONE] == 0, modes
    assert rows.keys() == eager_rows.keys()
    for rid, expected in eager_rows.items():
        assert len(expected) > 8
        np.testing.assert_array_equal(rows[rid], expected, err_msg=f"request {rid}")


@pytest.mark.parametrize("mode, kinds", [
    (CudaGraphMode.NONE, []),
    (CudaGraphMode.LOCAL_MLP, ["MLP", "sampling"]),
    (CudaGraphMode.FULL_DECODE_ONLY, ["full decode", "sampling"]),
    (CudaGraphMode.PIECEWISE, ["piecewise"]),
    (CudaGraphMode.FULL_AND_PIECEWISE, ["full decode", "sampling", "piecewise"]),
])
def test_capture_table_lists_the_graph_kinds_of_each_mode(tiny_loaded, mode, kinds):
    """The runner captures from one table of (kind, sizes): which kinds a mode needs, in order
    (the captures themselves need CUDA: tests/gpu/test_graph_paths.py)."""
    decode = (1, 2) if mode.decode_mode in (CudaGraphMode.FULL, CudaGraphMode.LOCAL_MLP) else ()
    graphs = CudaGraphDispatcher(mode, decode, (2, 8) if mode.piecewise else ())
    runner = ModelRunner(tiny_loaded.talker, get_backend("torch"), KVCacheSpec(8, 16), max_num_seqs=2,
                         max_num_batched_tokens=8, max_model_len=64, device=tiny_loaded.device,
                         dtype=tiny_loaded.dtype, graphs=graphs)
    assert [kind for kind, _, _ in runner._graph_captures()] == kinds
