"""On CUDA: eager steps replayed from launch tapes (kernels/launch_tape.py, worker/eager_tapes.py)
give the same rows, bit for bit, as the same steps launched op by op (decodes, and prefill steps
padded to a multiple of 8 tokens, which the op-by-op side does not pad):
the high-throughput path (eager attention + MLP graphs) and the all-eager path, greedy and
seeded, bfloat16 (the skinny GEMMs: float32 GEMMs run on cuBLAS, which no tape records), with the
model-dtype and the fp8 KV cache. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine.async_engine import SyncEngine
from higgs_serve.engine.builder import RuntimeOptions, load_model
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.model import fused_ops
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.worker.cuda_graphs import CudaGraphDispatcher, CudaGraphMode
from support.bench_modules import load_bench

TEXTS = ["Hello there.", "The cat quickly reads the morning news.", "Short one.",
         "A much longer sentence that keeps the model busy for a while, with commas, and more words."]
OPTIONS = RuntimeOptions(device="cuda", dtype="bfloat16")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir), OPTIONS)


@pytest.fixture(autouse=True)
def gemms_as_the_4b_talker(monkeypatch):
    """Every GEMM of up to 64 rows on the skinny kernel, as for the 4B talker's four shapes (the
    tiny widths have no measured buckets past 16 rows): the prompts' prefill steps, 17-64 tokens
    here, are then taped too. Both sides of each comparison run it."""
    monkeypatch.setattr(fused_ops, "config_for", load_bench("bench_eager_host").skinny_config_as_4b)


def _engine(loaded, mode: str, kv_cache_dtype: str, max_tokens: int = 64) -> SyncEngine:
    stage0 = {"max_num_seqs": 8, "max_num_batched_tokens": max_tokens, "num_gpu_blocks": 512, "enforce_eager": True,
              "kv_cache_dtype": kv_cache_dtype,
              "compilation_config": {"cudagraph_mode": mode, "cudagraph_capture_sizes": [1, 2, 4, 8]}}
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3", stage_overrides={"0": stage0},
                                device_count=torch.cuda.device_count())
    return SyncEngine(loaded, deploy, OPTIONS)


def _requests(temperature: float) -> list[SpeechRequest]:
    return [SpeechRequest(f"r{i}", text, SamplingParams(temperature=temperature, top_p=0.9, top_k=50, seed=7 + i,
                                                        max_new_tokens=24 + 7 * i, min_new_tokens=24 + 7 * i),
                          stream=True)
            for i, text in enumerate(TEXTS)]


def _rows(loaded, mode: str, kv_cache_dtype: str, temperature: float, taped: bool, max_tokens: int = 64):
    engine = _engine(loaded, mode, kv_cache_dtype, max_tokens)
    try:
        runner = engine.core.runner
        if not taped:
            runner.tapes = None
        rows = {r.request_id: r.rows for r in engine.generate_batch(_requests(temperature))}
        return rows, runner
    finally:
        engine.close()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("mode", ["LOCAL_MLP", "NONE"])
def test_taped_decode_steps_match_op_by_op(loaded, mode, temperature, kv_cache_dtype):
    expected, _ = _rows(loaded, mode, kv_cache_dtype, temperature, taped=False)
    got, runner = _rows(loaded, mode, kv_cache_dtype, temperature, taped=True)
    # the batch shrinks 4 -> 3 -> 2 -> 1 as requests finish: several sizes recorded, then replayed;
    # the prompts' prefill steps (at most 64 tokens here) are taped too, padded to 8-token sizes
    assert runner.tapes.replays > 20, runner.tapes.replays
    decodes = [key for key in runner.tapes.keys if key[0] == key[2] == key[3]]  # rows, requests, decodes
    prefills = [key for key in runner.tapes.keys if key not in decodes]
    assert {key[0] for key in decodes} >= {1, 4}, (runner.tapes.keys, runner.tapes.void_reasons)
    assert prefills and all(key[0] % 8 == 0 for key in prefills), (runner.tapes.keys, runner.tapes.void_reasons)
    if mode == "LOCAL_MLP":
        assert runner.step_modes[CudaGraphMode.LOCAL_MLP] > 0
        assert all(key[1] for key in decodes) and not any(key[1] for key in prefills)
    for rid, rows in expected.items():
        np.testing.assert_array_equal(got[rid], rows, err_msg=f"{mode}, request {rid}")


def test_steps_past_64_rows_are_taped_with_row_blocked_gemms(loaded):
    """A 128-token budget: the prompts' prefill and mixed steps of 65-128 rows run their GEMMs as
    row blocks of at most 64 on the skinny kernel (fused_ops.gemm_row_blocks), taped or not, and
    their tapes give the op-by-op rows bit for bit."""
    expected, _ = _rows(loaded, "LOCAL_MLP", "auto", 0.0, taped=False, max_tokens=128)
    got, runner = _rows(loaded, "LOCAL_MLP", "auto", 0.0, taped=True, max_tokens=128)
    assert [key for key in runner.tapes.keys if key[0] > 64], (runner.tapes.keys, runner.tapes.void_reasons)
    for rid, rows in expected.items():
        np.testing.assert_array_equal(got[rid], rows, err_msg=f"request {rid}")


def test_tapes_replay_right_after_other_code_churns_memory(loaded):
    """A tape's temporaries live in its private pool: big allocations on the default pool, filled
    with NaN, freed and handed back to the driver between steps, cannot land in them. Two runners
    on the same weights, one taping: the same rows, step by step, before and after the churn."""
    bench_step = load_bench("bench_step")
    # pages for 40 tokens a request (8 prefilled, then decodes up to position 19)
    shape = bench_step.BenchShape(batches=(1, 3), contexts=(40,), block_size=16, max_num_batched_tokens=64,
                                  max_model_len=128)
    policy = CudaGraphDispatcher(CudaGraphMode.LOCAL_MLP, decode_sizes=(1, 2, 3))
    runners = [bench_step.build_runner(loaded, policy, shape, launch_tapes=taped) for taped in (True, False)]
    plans = [bench_step.PlanMaker(shape, loaded.spec.text.vocab_size) for _ in runners]
    with torch.inference_mode():
        for runner, maker in zip(runners, plans):
            runner.capture_graphs()
            for plan in maker.prefill_plans(8, ()):
                runner.execute(plan)

        def step(batch: int, position: int) -> None:
            rows = [runner.execute(maker.decode_plan(batch, position)).rows for runner, maker in zip(runners, plans)]
            assert rows[0].keys() == rows[1].keys()
            for rid in rows[0]:
                np.testing.assert_array_equal(rows[0][rid], rows[1][rid], err_msg=f"B={batch} pos={position} {rid}")

        for position in range(8, 14):  # B = 3 and B = 1 recorded, then replayed
            step(3 if position % 2 else 1, position)
        junk = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(32)]  # 512 MB
        del junk
        torch.cuda.empty_cache()
        junk = [torch.full((1 << 20,), float("nan"), device="cuda") for _ in range(64)]
        for position in range(14, 20):
            step(3 if position % 2 else 1, position)
        del junk
    assert runners[0].tapes.replays >= 8 and runners[1].tapes is None


def test_a_dead_runners_tape_pool_goes_to_the_next_and_is_never_destroyed():
    """torch 2.11 aborts when a MemPool dies while any pool routes allocations: a closed (or
    collected) EagerTapes hands its pool to the next one made on the device."""
    from higgs_serve.worker.eager_tapes import EagerTapes

    device = torch.device("cuda", torch.cuda.current_device())
    first = EagerTapes(device, lambda: [])
    pool = first._pool
    del first
    second = EagerTapes(device, lambda: [])
    assert second._pool is pool
    third = EagerTapes(device, lambda: [])  # two live ones never share
    assert third._pool is not pool
