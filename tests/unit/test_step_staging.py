"""StepStager: a plan's chunks packed into the host staging buffers, plain decodes first."""

from __future__ import annotations

import numpy as np
import torch

from higgs_serve.worker.step_contract import NewRequestData, ScheduledChunk, StepPlan
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.worker.input_buffers import InputBuffers
from higgs_serve.worker.step_staging import StepStager

BLOCK = 4


def _new(slot: int, prompt_len: int, ref_rows=None, ref_start=0) -> NewRequestData:
    return NewRequestData(request_id=f"r{slot}", slot=slot, prompt_token_ids=tuple(range(100 + slot, 100 + slot + prompt_len)),
                          placeholder_rows=ref_rows, placeholder_start=ref_start, sampling=SamplingParams(seed=1),
                          max_frames=50, min_frames=0)


def _stager() -> StepStager:
    buffers = InputBuffers(max_tokens=32, max_seqs=4, max_blocks_per_seq=8, device=torch.device("cpu"))
    stager = StepStager(buffers, BLOCK, num_codebooks=2, pad_slot=4, scratch_block=99)
    stager.add(_new(0, 6))  # prompt chunk [2, 6)
    stager.add(_new(1, 3))  # decoding at position 9
    stager.add(_new(2, 5, ref_rows=((7, 8), (9, 10)), ref_start=1))  # clone prompt, first chunk [0, 3)
    stager.add(_new(3, 2))  # decoding at position 4
    return stager


def test_decodes_lead_and_every_field_lands_in_its_row():
    stager = _stager()
    plan = StepPlan(step_id=1, new_requests=(), released_slots=(), chunks=(
        ScheduledChunk("r0", 0, 2, 4, (10, 11), samples=True),
        ScheduledChunk("r1", 1, 9, 1, (20, 21, 22), samples=True),
        ScheduledChunk("r2", 2, 0, 3, (30,), samples=False),
        ScheduledChunk("r3", 3, 4, 1, (40, 41), samples=True),
    ))
    staged = stager.stage(plan)
    buf = stager.buffers
    n = staged.num_tokens
    assert n == 1 + 1 + 4 + 3 and staged.num_decodes == 2 and staged.has_audio and staged.has_text
    # rows: r1 decode, r3 decode, r0 prompt tokens 2..5, r2 prompt tokens 0..2
    np.testing.assert_array_equal(buf.host("positions")[:n], [9, 4, 2, 3, 4, 5, 0, 1, 2])
    np.testing.assert_array_equal(buf.host("token_ids")[:n], [0, 0, 102, 103, 104, 105, 102, 103, 104])
    np.testing.assert_array_equal(buf.host("audio_src_slot")[:n], [1, 3, -1, -1, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(buf.host("ref_row_index")[:n], [-1, -1, -1, -1, -1, -1, -1, 0, 1])
    np.testing.assert_array_equal(buf.host("slot_mapping")[:n],
                                  [22 * BLOCK + 1, 41 * BLOCK + 0, 10 * BLOCK + 2, 10 * BLOCK + 3, 11 * BLOCK + 0,
                                   11 * BLOCK + 1, 30 * BLOCK + 0, 30 * BLOCK + 1, 30 * BLOCK + 2])
    np.testing.assert_array_equal(buf.host_query_start_loc()[:5], [0, 1, 2, 6, 9])
    np.testing.assert_array_equal(buf.host_seq_lens()[:4], [10, 5, 6, 3])
    np.testing.assert_array_equal(buf.host_block_tables()[:4, :3], [[20, 21, 22], [40, 41, 0], [10, 11, 0], [30, 0, 0]])
    assert staged.sample_ids == ["r1", "r3", "r0"]  # r2's chunk does not end its prompt
    np.testing.assert_array_equal(buf.host("sample_token_index")[:3], [0, 1, 5])
    np.testing.assert_array_equal(buf.host("sample_slots")[:3], [1, 3, 0])
    np.testing.assert_array_equal(np.concatenate(staged.ref_parts), [[7, 8], [9, 10]])


def test_padding_rows_write_nothing_real():
    stager = _stager()
    buf = stager.buffers
    stager.fill_token_padding(3, 8, 1, 4)
    np.testing.assert_array_equal(buf.host("slot_mapping")[3:8], -1)
    np.testing.assert_array_equal(buf.host("audio_src_slot")[3:8], -1)
    np.testing.assert_array_equal(buf.host("sample_slots")[1:4], 4)
    stager.fill_decode_padding(2, 4)
    np.testing.assert_array_equal(buf.host("slot_mapping")[2:4], 99 * BLOCK)
    np.testing.assert_array_equal(buf.host("audio_src_slot")[2:4], 4)
    np.testing.assert_array_equal(buf.host_block_tables()[2:4, 0], 99)
    np.testing.assert_array_equal(buf.host_seq_lens()[2:4], 1)


def test_sample_padding_steps_the_pad_slot_and_leaves_the_real_rows():
    stager = _stager()
    plan = StepPlan(step_id=1, new_requests=(), released_slots=(), chunks=(
        ScheduledChunk("r1", 1, 9, 1, (20, 21, 22), samples=True),
        ScheduledChunk("r3", 3, 4, 1, (40, 41), samples=True),
    ))
    staged = stager.stage(plan)
    slots = stager.buffers.host("sample_slots")
    real = slots[:2].copy()
    stager.fill_sample_padding(len(staged.sample_ids), 4)  # a sampling graph of 4 rows
    assert np.array_equal(slots[:2], real) and list(slots[2:4]) == [4, 4]


def _decode(rid: str, slot: int, pos: int, blocks: tuple[int, ...]) -> StepPlan:
    return StepPlan(step_id=pos, new_requests=(), released_slots=(),
                    chunks=(ScheduledChunk(rid, slot, pos, 1, blocks, samples=True),))


def test_block_table_rows_follow_a_growing_table_and_a_reused_slot():
    """Decode rows come from the slot's cached table: new blocks appear as the request grows, and
    a new request in the same slot starts from a clean row (no blocks of the one before)."""
    stager = _stager()
    bt = stager.buffers.host_block_tables()
    stager.stage(_decode("r1", 1, 11, (20, 21, 22)))
    np.testing.assert_array_equal(bt[0], [20, 21, 22, 0, 0, 0, 0, 0])
    stager.stage(_decode("r1", 1, 12, (20, 21, 22, 23)))  # crossed into a new block
    np.testing.assert_array_equal(bt[0], [20, 21, 22, 23, 0, 0, 0, 0])
    assert stager.buffers.host("slot_mapping")[0] == 23 * BLOCK + 0
    stager.release(1)
    stager.add(_new(1, 2))  # the slot's next request: a shorter table
    stager.stage(_decode("r9", 1, 2, (50,)))
    np.testing.assert_array_equal(bt[0], [50, 0, 0, 0, 0, 0, 0, 0])
    assert stager.buffers.host("slot_mapping")[0] == 50 * BLOCK + 2


def test_decodes_after_a_prompt_chunk_still_lead():
    """Plans from elsewhere than the scheduler may list a decode after a prompt chunk."""
    stager = _stager()
    plan = StepPlan(step_id=1, new_requests=(), released_slots=(), chunks=(
        ScheduledChunk("r0", 0, 2, 4, (10, 11), samples=True),
        ScheduledChunk("r1", 1, 9, 1, (20, 21, 22), samples=True),
    ))
    staged = stager.stage(plan)
    assert staged.sample_ids == ["r1", "r0"] and staged.num_decodes == 1
    assert stager.buffers.host("positions")[0] == 9
