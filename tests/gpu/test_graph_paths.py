"""On CUDA: the Stage 0 paths (eager, MLP graphs, full decode graph, piecewise graphs alone and
under the full decode graph) give identical rows, with the model-dtype KV cache and with an fp8
one (kv_cache_dtype: fp8: every path writes and reads the same e4m3 cache the same way), and
with programmatic dependent launch (kernels/pdl.py; on by default on Hopper) switched off.

Greedy (temperature 0) and seeded sampling, a mixed set of requests of different lengths that
arrive while others run, so graph steps, padded batches and eager prefill/mixed steps all occur.
Graphs must be captured at start-up, before the first request. Skipped without CUDA.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine.async_engine import SyncEngine
from higgs_serve.engine.builder import RuntimeOptions, build_engine_parts, load_model
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.kernels import pdl
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.worker.cuda_graphs import CudaGraphMode

TEXTS = [
    "Hello there.",
    "The cat quickly reads the morning news.",
    "A much longer sentence that keeps the model busy for a while, with commas, and more words.",
    "Short one.",
    "Numbers like twenty five and forty two are spoken too.",
]

PATHS = {
    "eager": {"enforce_eager": True, "compilation_config": {"cudagraph_mode": "NONE",
                                                             "cudagraph_capture_sizes": [1, 2, 4, 8]}},
    "mlp": {"enforce_eager": True, "compilation_config": {"cudagraph_mode": "LOCAL_MLP",
                                                           "cudagraph_capture_sizes": [1, 2, 4, 8]}},
    "full": {"enforce_eager": False, "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY",
                                                             "cudagraph_capture_sizes": [1, 2, 4, 8]}},
    "piecewise": {"enforce_eager": True, "compilation_config": {"cudagraph_mode": "PIECEWISE",
                                                                 "cudagraph_capture_sizes": [1, 2, 4, 8, 24, 64]}},
    "full_and_piecewise": {"enforce_eager": False,
                           "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE",
                                                  "cudagraph_capture_sizes": [1, 2, 4, 8, 24, 64]}},
}
PATHS["full_and_piecewise_no_pdl"] = PATHS["full_and_piecewise"]
NO_PDL = {"full_and_piecewise_no_pdl"}  # captured and run with plain launches
EXPECTED_MODES = {"mlp": [CudaGraphMode.LOCAL_MLP], "full": [CudaGraphMode.FULL], "piecewise": [CudaGraphMode.PIECEWISE],
                  "full_and_piecewise": [CudaGraphMode.FULL, CudaGraphMode.PIECEWISE],
                  "full_and_piecewise_no_pdl": [CudaGraphMode.FULL, CudaGraphMode.PIECEWISE]}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir), RuntimeOptions(device="cuda", dtype="float32"))


def _deploy(path: str, kv_cache_dtype: str = "auto"):
    stage0 = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "num_gpu_blocks": 512,
              "kv_cache_dtype": kv_cache_dtype, **PATHS[path]}
    return load_deploy_config(None, "higgs_multimodal_qwen3", stage_overrides={"0": stage0},
                              device_count=torch.cuda.device_count())


def _engine(loaded, path: str, kv_cache_dtype: str = "auto") -> SyncEngine:
    return SyncEngine(loaded, _deploy(path, kv_cache_dtype), RuntimeOptions(device="cuda", dtype="float32"))


def _requests(temperature: float) -> list[SpeechRequest]:
    out = []
    for i, text in enumerate(TEXTS):
        sampling = SamplingParams(temperature=temperature, top_p=0.9, top_k=50, seed=1000 + i,
                                  max_new_tokens=20 + 9 * i, min_new_tokens=20 + 9 * i)
        out.append(SpeechRequest(f"r{i}", text, sampling, stream=True))
    return out


def _run(engine: SyncEngine, requests: list[SpeechRequest]) -> dict[str, np.ndarray]:
    """First three at once, the rest a little later (different arrival times)."""
    results = {}
    first = threading.Thread(target=lambda: results.update(
        {r.request_id: r.rows for r in engine.generate_batch(requests[:3])}))
    first.start()
    later = engine.generate_batch(requests[3:])
    first.join()
    results.update({r.request_id: r.rows for r in later})
    return results


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graph_paths_match_eager(loaded, temperature, kv_cache_dtype):
    rows = {}
    for path in PATHS:
        pdl.set_enabled(False if path in NO_PDL else None)
        engine = _engine(loaded, path, kv_cache_dtype)
        try:
            runner = engine.core.runner
            expected_kv = torch.float8_e4m3fn if kv_cache_dtype == "fp8" else torch.float32
            assert runner.kv_caches[0][0].dtype == expected_kv
            if path != "eager":
                assert runner.capture_info, "graphs must be captured at start-up"
                assert runner.step_modes[CudaGraphMode.NONE] == 0  # nothing ran before the first request
            rows[path] = _run(engine, _requests(temperature))
            for mode in EXPECTED_MODES.get(path, []):
                assert runner.step_modes[mode] > 0, (path, runner.step_modes)
            if "piecewise" in path:
                assert runner.step_modes[CudaGraphMode.NONE] == 0, runner.step_modes  # every step had a graph
        finally:
            engine.close()
            pdl.set_enabled(None)
    for path in EXPECTED_MODES:
        for rid, expected in rows["eager"].items():
            np.testing.assert_array_equal(rows[path][rid], expected, err_msg=f"{path} path, request {rid}")


def test_capture_reports_progress_after_each_size(loaded):
    """`on_progress(done, total, label)` passed to the builder follows every captured size."""
    calls: list[tuple[int, int, str]] = []
    parts = build_engine_parts(loaded, _deploy("full_and_piecewise"), on_progress=lambda *call: calls.append(call))
    info = parts.runner.capture_info
    total = sum(len(kind["sizes"]) for kind in info)
    assert [kind["kind"] for kind in info] == ["full decode", "sampling", "piecewise"]
    assert [done for done, _, _ in calls] == list(range(1, total + 1)) and {t for _, t, _ in calls} == {total}
    assert calls[0][2] == "full decode graph, size 8" and calls[-1][2] == "piecewise graph, size 1"
