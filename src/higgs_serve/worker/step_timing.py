"""Stage 0's steps timed at start-up, for the deadline policy (docs/architecture.md#admission-a-measured-limit).

After warm-up and graph capture, before any request: for each batch size asked, `n` synthetic
requests sit in slots 0..n-1 at a mid-stream context (CONTEXT_TOKENS) and run decode steps
exactly as the engine loop runs them: launched one ahead of the collect (the loop's lookahead),
so a step's time is the time between two collects, the figure the live step-time model learns
from. Each size first runs WARM_STEPS untimed (a launch tape or the allocator's first touch of a
shape must not count), then `steps` timed ones, of which the fastest is kept: what else runs on a
shared host only ever adds time, and that level is the live steps' to set (the step model scales
the timings to them, engine/deadlines/step_model.py). A prompt token's cost is one prompt chunk
of PROMPT_TOKENS alone, less a one-sequence decode, per token beyond the first.

Their K/V go to blocks of the pool no request holds yet (one block table per slot, from block 1;
the scratch block where the pool is too small), so attention reads as many distinct blocks as a
live step of that context would. Nothing is left behind: the slots are released and the runner's
step counters reset, as after the prefill tapes (model_runner.py `record_prefill_tapes`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from higgs_serve.sampling_params import SamplingParams
from higgs_serve.worker.step_contract import NewRequestData, ScheduledChunk, StepPlan

if TYPE_CHECKING:
    from higgs_serve.worker.model_runner import ModelRunner

CONTEXT_TOKENS = 256  # a stream a few seconds in: a 60-token prompt and ~200 rows
WARM_STEPS = 1  # the first step of a shape may record a launch tape or touch new memory
PROMPT_TOKENS = 256


def time_decode_steps(runner: ModelRunner, sizes: tuple[int, ...], steps: int = 3) -> dict[int, int]:
    """{n: µs of a decode step of n sequences} for each n in `sizes` (module note)."""
    timed = {n: _time_size(runner, n, steps) for n in sorted(set(sizes)) if 0 < n <= runner.max_num_seqs}
    runner.reset_step_counts()
    return timed


def time_prompt_token(runner: ModelRunner, decode_one_us: int, steps: int = 3) -> int:
    """µs a prompt token adds to a step: a PROMPT_TOKENS prefill alone, less a decode of one
    (`decode_one_us`), per token beyond the first (module note)."""
    tokens = min(PROMPT_TOKENS, runner.max_model_len - 1, runner.buffers.max_tokens)
    times = []
    for i in range(WARM_STEPS + steps):
        new = _request(runner, 0, tokens, f"time-prompt-{i}")
        chunk = ScheduledChunk(new.request_id, 0, 0, tokens, _pages(runner, 0, tokens), samples=True)
        t0 = time.perf_counter()
        runner.execute(StepPlan(step_id=-1, new_requests=(new,), chunks=(chunk,), released_slots=(0,)))
        times.append(time.perf_counter() - t0)
    runner.stager.release(0)
    runner.reset_step_counts()
    step_us = min(times[WARM_STEPS:]) * 1e6
    return max(1, int((step_us - decode_one_us) / max(1, tokens - 1)))


def _time_size(runner: ModelRunner, n: int, steps: int) -> int:
    news = tuple(_request(runner, slot, CONTEXT_TOKENS, f"time-{n}-{slot}") for slot in range(n))
    collects = []
    pending = None
    for i in range(WARM_STEPS + steps + 2):
        pos = CONTEXT_TOKENS + i
        chunks = tuple(ScheduledChunk(new.request_id, new.slot, pos, 1, _pages(runner, new.slot, pos + 1), samples=True)
                       for new in news)
        plan = StepPlan(step_id=-1, new_requests=news if i == 0 else (), chunks=chunks, released_slots=())
        launched = runner.launch(plan)  # the CPU computes here, a GPU queues
        if pending is not None:
            runner.collect(pending)
            collects.append(time.perf_counter())
        pending = launched
    runner.collect(pending)  # not timed: on the CPU the last step was computed before it
    for slot in range(n):
        runner.stager.release(slot)
    # between two collects inside the loop: a launch and a collect, as in the engine loop
    gaps = [b - a for a, b in zip(collects, collects[1:])][WARM_STEPS:]
    return max(1, int(min(gaps) * 1e6))


def _request(runner: ModelRunner, slot: int, prompt_tokens: int, request_id: str) -> NewRequestData:
    # a decode chunk past the prompt reads the slot's last row (its start state): no prefill needed
    return NewRequestData(request_id=request_id, slot=slot, prompt_token_ids=(0,) * prompt_tokens,
                          placeholder_rows=None, placeholder_start=0,
                          sampling=SamplingParams(seed=slot), max_frames=1 << 20, min_frames=0)


def _pages(runner: ModelRunner, slot: int, num_tokens: int) -> tuple[int, ...]:
    """The slot's block table for `num_tokens` tokens: its own blocks of the pool, from block 1
    (the scratch block where the pool has too few)."""
    size = runner.kv.block_size
    per_slot = -(-(CONTEXT_TOKENS + WARM_STEPS + 64) // size)
    count = -(-num_tokens // size)
    first = 1 + slot * per_slot
    if first + per_slot > runner.kv.num_blocks:
        return (runner.scratch_block,) * count
    return tuple(range(first, first + count))
