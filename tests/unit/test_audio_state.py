from dataclasses import dataclass

import numpy as np
import pytest
import torch

from higgs_serve.model.delay_pattern import BOC, EOC, apply_delay, rows_to_codec_frames
from higgs_serve.worker.audio_state import AudioState

V = 1026
HUGE = 1e4


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


@dataclass(frozen=True)
class Knobs:
    temperature: float = 1.0
    top_k: int | None = 0
    top_p: float = 1.0
    seed: int | None = 1


def _run(state: AudioState, slot: int, logits_fn, max_steps: int = 400) -> torch.Tensor:
    """Step one slot alone until done; logits_fn(t) -> [8, V]. Returns rows [N, 8]."""
    rows = []
    slots = torch.tensor([slot])
    for t in range(max_steps):
        row, done = state.step(slots, logits_fn(t)[None])
        rows.append(row[0])
        if bool(done[0]):
            return torch.stack(rows)
    raise AssertionError(f"slot {slot} not done after {max_steps} rows")


def _random_logits(seed: int, eoc_bias: float = 0.0):
    g = torch.Generator().manual_seed(seed)

    def fn(t: int) -> torch.Tensor:
        logits = torch.randn(8, V, generator=g)
        logits[:, BOC] += HUGE  # the masks, not the logits, must keep BOC where it belongs
        logits[:, EOC] += eoc_bias
        return logits
    return fn


def _fresh(slot: int = 0, max_frames: int = 1000, min_frames: int = 8, **knobs) -> AudioState:
    state = AudioState(max_slots=4)
    state.add(slot, Knobs(**knobs), max_frames=max_frames, min_frames=min_frames)
    return state


def _check_normal_rows(rows: torch.Tensor, ramp_start: int) -> None:
    for t in range(ramp_start):
        for q in range(8):
            code = int(rows[t, q])
            if q > t:
                assert code == BOC, (t, q)
            else:
                assert code < BOC, (t, q)  # active: never BOC, never EOC (cb0 before R)


def _check_ramp(rows: torch.Tensor, ramp_start: int) -> None:
    assert rows.shape[0] == ramp_start + 8
    assert rows[ramp_start, 0] == EOC
    for k in range(1, 8):
        row = rows[ramp_start + k]
        assert (row[:k] == EOC).all(), k
        assert (row[k:] < BOC).all(), k


def test_first_rows_follow_the_boc_pattern_and_ramp_down_shape():
    rows = _run(_fresh(), 0, _random_logits(1, eoc_bias=4.0))
    ramp_start = int((rows[:, 0] == EOC).nonzero()[0])
    assert ramp_start >= 8
    _check_normal_rows(rows, ramp_start)
    _check_ramp(rows, ramp_start)
    assert rows_to_codec_frames(rows, finished_naturally=True).shape == (ramp_start, 8)


@pytest.mark.parametrize("min_frames", [8, 13])
def test_minimum_length_even_with_huge_eoc_logit(min_frames):
    rows = _run(_fresh(min_frames=min_frames), 0, _random_logits(2, eoc_bias=2 * HUGE))
    assert int((rows[:, 0] == EOC).nonzero()[0]) == min_frames
    _check_normal_rows(rows, min_frames)
    _check_ramp(rows, min_frames)
    assert rows_to_codec_frames(rows, True).shape[0] == min_frames


@pytest.mark.parametrize("max_frames", [9, 20])
def test_max_frames_cap_gives_exactly_max_frames(max_frames):
    rows = _run(_fresh(max_frames=max_frames), 0, _random_logits(3, eoc_bias=-HUGE))
    assert rows.shape[0] == max_frames + 8
    _check_normal_rows(rows, max_frames)
    _check_ramp(rows, max_frames)
    frames = rows_to_codec_frames(rows, finished_naturally=True)
    assert frames.shape == (max_frames, 8) and (frames < BOC).all()


def test_cap_wins_over_minimum_and_tiny_caps_match_apply_delay():
    rows = _run(_fresh(max_frames=3, min_frames=8), 0, _random_logits(4, eoc_bias=-HUGE))
    assert rows.shape[0] == 11  # ramp starts at the cap (row 3), before the delay window closes
    frames = rows_to_codec_frames(rows, True)
    final = torch.tensor([[EOC] + [int(rows[3 + q, q]) for q in range(1, 8)]])
    assert frames.shape == (3, 8)
    assert np.array_equal(rows, apply_delay(np.concatenate([frames, final])))


@pytest.mark.parametrize("num_frames,min_frames", [(0, 0), (3, 0), (12, 8)])
def test_teacher_forced_generation_equals_offline_apply_delay(num_frames, min_frames):
    g = torch.Generator().manual_seed(num_frames)
    frames = torch.randint(0, 1024, (num_frames, 8), generator=g)
    # the EOC frame: codebook 0 ends the clip, its other codes are free (dropped later)
    final = torch.cat([torch.tensor([EOC]), torch.randint(0, 1024, (7,), generator=g)])
    expected = torch.from_numpy(apply_delay(torch.cat([frames, final[None]])))  # [T + 8, 8]

    def forced(t: int) -> torch.Tensor:
        logits = torch.randn(8, V, generator=g)
        return logits.scatter_add(1, expected[t][:, None], torch.full((8, 1), HUGE))

    rows = _run(_fresh(min_frames=min_frames, temperature=0.9, top_k=30, top_p=0.8), 0, forced)
    assert torch.equal(rows, expected)
    assert np.array_equal(rows_to_codec_frames(rows, finished_naturally=True), frames)


def test_random_requests_always_terminate_by_the_cap():
    state = AudioState(max_slots=6)
    caps = [8, 9, 15, 30, 31, 40]
    for slot, cap in enumerate(caps):
        state.add(slot, Knobs(seed=slot, temperature=1.2), max_frames=cap, min_frames=8)
    slots = torch.arange(6)
    g = torch.Generator().manual_seed(9)
    finished_at = {}
    for t in range(48):
        logits = torch.randn(6, 8, V, generator=g) * 3
        _, done = state.step(slots, logits)
        for slot in range(6):
            if bool(done[slot]) and slot not in finished_at:
                finished_at[slot] = t + 1  # rows emitted
    for slot, cap in enumerate(caps):
        assert slot in finished_at and 16 <= finished_at[slot] <= cap + 8


def test_slots_in_one_batch_evolve_like_each_alone():
    knobs = {1: Knobs(seed=11, temperature=0.8, top_k=30, top_p=0.8),
             3: Knobs(seed=12345678901234, temperature=1.1, top_k=None, top_p=0.95)}
    limits = {1: (20, 8), 3: (14, 10)}
    g = torch.Generator().manual_seed(10)
    logits = {slot: [torch.randn(8, V, generator=g) for _ in range(40)] for slot in knobs}
    for slot in knobs:  # a little EOC pull so natural ends happen too
        for lg in logits[slot]:
            lg[0, EOC] += 3.0

    alone = {}
    for slot in knobs:
        state = AudioState(max_slots=4)
        state.add(slot, knobs[slot], *limits[slot])
        alone[slot] = _run(state, slot, lambda t, s=slot: logits[s][t])

    for order in ([1, 3], [3, 1]):
        state = AudioState(max_slots=4)
        for slot in order:
            state.add(slot, knobs[slot], *limits[slot])
        got = {slot: [] for slot in order}
        finished = set()
        for t in range(40):
            batch = torch.stack([logits[s][t] for s in order])
            rows, done = state.step(torch.tensor(order), batch)
            for i, slot in enumerate(order):
                if slot not in finished:
                    got[slot].append(rows[i])
                if bool(done[i]):
                    finished.add(slot)
        for slot in order:
            assert torch.equal(torch.stack(got[slot]), alone[slot]), (order, slot)


def test_input_rows_are_the_last_rows_and_done_slots_are_frozen():
    state = _fresh(max_frames=8)
    slot = torch.tensor([0])
    fn = _random_logits(5)
    rows = _run(state, 0, fn)
    assert torch.equal(state.input_rows(slot)[0], rows[-1])
    frozen_index = int(state.row_index[0])
    extra, done = state.step(slot, fn(0)[None])
    assert bool(done[0]) and (extra == EOC).all()
    assert int(state.row_index[0]) == frozen_index
    assert torch.equal(state.input_rows(slot)[0], rows[-1])


def test_pad_slot_can_repeat_in_a_batch_without_touching_real_slots():
    fn = _random_logits(6)
    reference = _run(_fresh(max_frames=10), 0, fn)

    state = _fresh(max_frames=10)
    fn = _random_logits(6)
    pad = state.pad_slot
    slots = torch.tensor([pad, 0, pad, pad])
    got = []
    for t in range(reference.shape[0]):
        logits = torch.randn(4, 8, V)
        logits[1] = fn(t)
        rows, done = state.step(slots, logits)
        assert (rows[[0, 2, 3]] == EOC).all() and done[[0, 2, 3]].all()
        got.append(rows[1])
    assert torch.equal(torch.stack(got), reference)
    assert bool(state.done[0])


def test_masks_shape_and_first_row_rules():
    state = _fresh(max_frames=50)
    allowed = state.masks(torch.tensor([0]))
    assert allowed.shape == (1, 8, V) and allowed.dtype == torch.bool
    assert allowed[0, 0, :BOC].all() and not allowed[0, 0, BOC] and not allowed[0, 0, EOC]
    for q in range(1, 8):
        assert allowed[0, q].sum() == 1 and allowed[0, q, BOC]


def test_add_validates_inputs_and_reset_reuses_a_slot():
    state = AudioState(max_slots=2)
    with pytest.raises(ValueError, match="seed"):
        state.add(0, Knobs(seed=None), max_frames=10, min_frames=8)
    with pytest.raises(ValueError, match="slot"):
        state.add(2, Knobs(), max_frames=10, min_frames=8)
    with pytest.raises(ValueError, match="max_frames"):
        state.add(0, Knobs(), max_frames=-1, min_frames=8)
    state.add(1, Knobs(seed=(1 << 64) - 1), max_frames=10, min_frames=8)
    assert int(state.seed[1]) == -1
    first = _run(state, 1, _random_logits(7))
    state.remove(1)
    assert bool(state.done[1])
    state.add(1, Knobs(seed=(1 << 64) - 1), max_frames=10, min_frames=8)
    assert torch.equal(_run(state, 1, _random_logits(7)), first)
