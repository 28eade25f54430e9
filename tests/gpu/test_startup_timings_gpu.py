"""Issue 59 on CUDA: the steps the engine times at start-up for the deadline policy (engine/builder.py
`time_for_deadlines`, worker/step_timing.py) replay the profile's own graphs at every size and
leave nothing behind: an engine that timed them gives the rows of one handed the same timings
without running them, on the MLP-graph path (the default profile) and under the full decode and
piecewise graphs, greedy and sampled. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_graph_paths import PATHS, _requests, _run

from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine import builder
from higgs_serve.engine.async_engine import SyncEngine
from higgs_serve.engine.builder import RuntimeOptions, load_model

CUDA = RuntimeOptions(device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir), CUDA)


def _engine(loaded, path: str) -> SyncEngine:
    stage0 = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "num_gpu_blocks": 512, **PATHS[path]}
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3", stage_overrides={"0": stage0},
                                cli_overrides={"watermark": False}, device_count=torch.cuda.device_count())
    return SyncEngine(loaded, deploy, CUDA)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("path", ["mlp", "full_and_piecewise"])
def test_timing_at_start_up_leaves_the_rows_as_they_were(loaded, path, temperature, monkeypatch):
    seen = []
    timed = builder.time_for_deadlines
    monkeypatch.setattr(builder, "time_for_deadlines", lambda *a: seen.append(timed(*a)) or seen[-1])
    engine = _engine(loaded, path)
    try:
        assert not any(engine.core.runner.step_modes.values())
        rows = _run(engine, _requests(temperature))
    finally:
        engine.close()
    (timings,) = seen
    assert sorted(timings.decode_us) == [1, 2, 4, 8] and timings.token_us > 0
    assert all(0 < us < 1_000_000 for us in timings.decode_us.values())
    monkeypatch.setattr(builder, "time_for_deadlines", lambda *a: timings)  # the same numbers, nothing run
    engine = _engine(loaded, path)
    try:
        untimed = _run(engine, _requests(temperature))
    finally:
        engine.close()
    for rid, expected in untimed.items():
        np.testing.assert_array_equal(rows[rid], expected, err_msg=f"{path} path, request {rid}")
