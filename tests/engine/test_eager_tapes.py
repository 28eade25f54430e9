"""Launch tapes in the runner (worker/eager_tapes.py) on CPU, with the Triton launches replaced by
fakes that only count: the real eager decode path (TritonOps, the Triton attention backend's
host code) records one tape per batch size, later steps of that size issue exactly the recorded
launches and none op by op, and a step that does device work the tape cannot hold (a cuBLAS
GEMM) stays eager. The numbers the tapes produce are checked against op-by-op steps on CUDA
(tests/gpu/test_launch_tapes.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from higgs_serve.config.deploy import CudaGraphMode
from higgs_serve.engine.builder import RuntimeOptions, load_model
from higgs_serve.model import fused_ops
from higgs_serve.worker.eager_tapes import MAX_VOID_RECORDINGS
from higgs_serve.worker.model_runner import TAPE_MAX_ROWS
from support.bench_modules import load_bench

bench_step = load_bench("bench_step")
harness = load_bench("bench_eager_host")  # the fake launchers and the host-only attention backend


@pytest.fixture
def counts():
    with harness.fake_launches() as counts:
        yield counts


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), RuntimeOptions(device="cpu", dtype="bfloat16"))
    loaded.talker.backbone.set_ops(fused_ops.TritonOps)
    yield loaded
    loaded.talker.backbone.set_ops(fused_ops.TorchOps)


def _runner_and_plans(loaded, batches=(1, 3), context: int = 8, max_tokens: int = 64, mixed_tokens: int = 0):
    """A taping runner on the host-only Triton path whose `batches[-1]` requests are prefilled
    with `context` tokens each (and, with `mixed_tokens`, one more request whose prompt of that
    many tokens each mixed plan prefills)."""
    shape = bench_step.BenchShape(batches=batches, contexts=(context,), block_size=16,
                                  max_num_batched_tokens=max_tokens, max_model_len=64, mixed_tokens=mixed_tokens)
    runner = harness.build_runner(loaded, shape, tapes=True)
    plans = bench_step.PlanMaker(shape, loaded.spec.text.vocab_size)
    with torch.inference_mode():
        for plan in plans.prefill_plans(context, ()):
            runner.execute(plan)
    return runner, plans


def _decode(runner, plans, batch: int, counts) -> tuple[int, int]:
    """(launches op by op, launches issued) of one decode step."""
    before = counts.op_by_op, counts.issued
    with torch.inference_mode():
        runner.execute(plans.decode_plan(batch, 8))
    return counts.op_by_op - before[0], counts.issued - before[1]


def test_decode_steps_replay_their_batch_size_tape(loaded, counts):
    runner, plans = _runner_and_plans(loaded)
    for batch in (1, 3):
        recorded_op_by_op, recorded_issued = _decode(runner, plans, batch, counts)
        assert recorded_op_by_op == recorded_issued > 0  # the recording step runs op by op
        for _ in range(2):
            # the same launches, all from the tape but the final norm's (it follows the tape)
            assert _decode(runner, plans, batch, counts) == (1, recorded_issued)
    keys = runner.tapes.keys  # (token rows, MLP graphs, requests, decodes, prefill query tiles)
    assert (1, False, 1, 1, 1) in keys and (3, False, 3, 3, 1) in keys
    assert runner.tapes.replays == 4
    # the metrics' count: the two decode recordings, and the 3-prompt prefill step (24 rows, whose
    # GEMMs go to cuBLAS at these widths: a void recording)
    assert runner.eager_steps == {"replay": 4, "recorded": 2, "void": 1, "op_by_op": 0}


def test_a_mixed_step_past_64_rows_is_taped_with_row_blocked_gemms(loaded, counts, monkeypatch):
    """40 decodes and a 40-token prompt chunk: 80 rows, whose GEMMs run as a 64-row and a 16-row
    block on the skinny kernel (fused_ops.gemm_row_blocks; cuBLAS could not go on the tape)."""
    monkeypatch.setattr(fused_ops, "config_for", harness.skinny_config_as_4b)  # 17-64-row blocks too
    runner, plans = _runner_and_plans(loaded, batches=(40,), max_tokens=128, mixed_tokens=40)
    replays_before = runner.tapes.replays  # the 128-row prefill steps of the 40 prompts share a tape
    issued = []
    for _ in range(3):
        before = counts.op_by_op, counts.issued
        with torch.inference_mode():
            runner.execute(plans.mixed_plan(40, 8))
        issued.append((counts.op_by_op - before[0], counts.issued - before[1]))
    assert issued[0][0] == issued[0][1] > 0 and issued[1] == issued[2] == (1, issued[0][1])
    assert (80, False, 41, 40, 2) in runner.tapes.keys and runner.tapes.replays - replays_before == 2
    assert not runner.tapes.void_reasons


def test_prefill_tapes_are_recorded_before_traffic(loaded, counts, monkeypatch):
    """One prompt per taped prefill size runs at start-up (slot 0, K/V on the scratch block), so
    a fresh server's first prompt of a length replays a tape instead of recording one."""
    monkeypatch.setattr(fused_ops, "config_for", harness.skinny_config_as_4b)  # 17-64-row GEMMs too
    shape = bench_step.BenchShape(batches=(1,), contexts=(20,), block_size=16, max_num_batched_tokens=48,
                                  max_model_len=64)
    runner = harness.build_runner(loaded, shape, tapes=True)
    assert runner.record_prefill_tapes() == 6  # 8, 16, ..., 48 rows: the step budget
    assert runner.tapes.keys == [(n, False, 1, 0, -(-n // 32)) for n in range(8, 49, 8)]
    assert sum(runner.step_modes.values()) == 0  # serving's step counts start at zero
    before = counts.op_by_op
    with torch.inference_mode():  # a 20-token prompt in slot 0, released by the recording: the 24-row tape
        for plan in bench_step.PlanMaker(shape, loaded.spec.text.vocab_size).prefill_plans(20, ()):
            runner.execute(plan)
    assert counts.op_by_op - before == 1 and runner.tapes.replays == 1  # only the final norm op by op


def test_prefill_tapes_are_recorded_only_for_sizes_that_run_eagerly(loaded, counts, monkeypatch):
    """A profile whose prefills of some sizes replay graphs (piecewise) records only the others
    at start-up; the high-throughput profile's prefill and mixed steps are all mode none (its
    MLP graphs serve decode steps only)."""
    assert CudaGraphMode.LOCAL_MLP.mixed_mode is CudaGraphMode.NONE
    shape = bench_step.BenchShape(batches=(1,), contexts=(20,), block_size=16, max_num_batched_tokens=48,
                                  max_model_len=64)
    runner = harness.build_runner(loaded, shape, tapes=True)
    mode_of = {8: CudaGraphMode.PIECEWISE, 16: CudaGraphMode.PIECEWISE, 24: CudaGraphMode.PIECEWISE,
               32: CudaGraphMode.NONE, 40: CudaGraphMode.NONE, 48: CudaGraphMode.NONE}
    monkeypatch.setattr(runner, "graphs", SimpleNamespace(dispatch=lambda n, pure_decode: (mode_of[n], n)))
    ran = []
    monkeypatch.setattr(runner, "execute", lambda plan: ran.append(plan.chunks[0].num_tokens))
    assert runner.record_prefill_tapes() == 3
    assert ran == [32, 40, 48]


def test_a_step_the_tape_cannot_hold_stays_eager(loaded, counts, monkeypatch):
    runner, plans = _runner_and_plans(loaded)
    before = runner.eager_steps
    monkeypatch.setattr(fused_ops, "config_for", lambda *shape: None)  # every GEMM on cuBLAS (aten::mm)
    for _ in range(MAX_VOID_RECORDINGS + 2):
        op_by_op, issued = _decode(runner, plans, 1, counts)
        assert op_by_op == issued > 0
    assert not [key for key in runner.tapes.keys if key[0] == 1] and runner.tapes.replays == 0
    after = runner.eager_steps
    assert after["void"] - before["void"] == MAX_VOID_RECORDINGS and after["op_by_op"] - before["op_by_op"] == 2


def test_a_tape_that_fails_to_launch_turns_tapes_off_and_the_step_still_runs(loaded, counts):
    runner, plans = _runner_and_plans(loaded)
    _decode(runner, plans, 1, counts)  # recorded
    tape = runner.tapes._tapes[(1, False, 1, 1, 1)]

    def refuses(*a):
        raise TypeError("pointer argument must be a tensor")  # a launcher that takes no raw pointers

    tape.entries[0] = (refuses, tape.entries[0][1])
    op_by_op, issued = _decode(runner, plans, 1, counts)
    assert op_by_op == issued > 0  # the step ran op by op
    assert runner.tapes.disabled and runner.tapes.keys == []
    assert _decode(runner, plans, 1, counts)[0] > 1  # and so do the later ones (no new recording)
    assert runner.tapes.keys == []


def test_batches_past_the_taped_rows_are_never_recorded(loaded, counts):
    """Past TAPE_MAX_ROWS the GEMMs run on cuBLAS: recording them would only cost (a slower step,
    then a void tape)."""
    batch = TAPE_MAX_ROWS + 1
    runner, plans = _runner_and_plans(loaded, batches=(batch,), context=4, max_tokens=batch + 16)
    with torch.inference_mode():
        runner.execute(plans.decode_plan(batch, 4))
    # (the tiny model's prefill steps past 16 rows void: its GEMM shapes have no skinny bucket there)
    assert all(key[0] <= TAPE_MAX_ROWS for key in [*runner.tapes.keys, *runner.tapes._voids])


def test_mixed_steps_are_padded_to_share_a_tape(loaded, counts):
    """3 decodes + a 5-token prompt chunk = 8 rows; + 6 tokens = 9 rows, padded to 16: the second
    shape's padding rows belong to no request and write no K/V, and the step replays its tape."""
    runner, plans = _runner_and_plans(loaded, batches=(3,), mixed_tokens=6)
    buf = runner.buffers
    with torch.inference_mode():
        runner.execute(plans.mixed_plan(3, 8))  # recorded (op by op)
        before = counts.op_by_op
        runner.execute(plans.mixed_plan(3, 8))
    assert counts.op_by_op - before == 1  # the final norm: the decoder stack came from the tape
    assert (16, False, 4, 3, 1) in runner.tapes.keys and runner.tapes.replays == 1
    np.testing.assert_array_equal(buf.host("slot_mapping")[9:16], -1)
    np.testing.assert_array_equal(buf.host("audio_src_slot")[9:16], -1)
    assert buf.host_query_start_loc()[4] == 9  # the requests end at the real rows


def test_a_serving_sweep_replays_tapes_for_nearly_every_eager_step(tmp_path):
    """bench_tape_keys: the real engine under closed-loop clients, its eager steps counted by kind.
    Every step is one of the kinds; after the first wave, decodes replay their tapes."""
    out = tmp_path / "keys.json"
    assert load_bench("bench_tape_keys").main(["--concurrency", "1", "4", "--frames", "24", "--warmup", "1",
                                               "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["concurrency"] for r in rows] == [1, 4]
    for row in rows:
        assert row["steps"] == row["replay"] + row["recorded"] + row["void"] + row["op_by_op"] > 0
        assert row["void"] == 0
        assert row["replay"] > 0.8 * row["steps"]
