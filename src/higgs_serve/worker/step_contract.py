"""The engine ↔ worker boundary (the step contract, owned by the worker): one plain dataclass per
step in each direction. The engine imports it downwards; the worker never imports the engine.

The scheduler never touches tensors; the runner never re-derives policy. Per plan, the runner
first frees `released_slots`, then adds `new_requests`, then executes `chunks` in order (a slot
released in a plan may be handed to a new request in the same plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from higgs_serve.sampling_params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """Sent once, the first time a request is scheduled (nothing is ever preempted)."""

    request_id: str
    slot: int  # persistent per-request row in the runner's state, 0..max_num_seqs-1
    prompt_token_ids: tuple[int, ...]
    placeholder_rows: tuple | None  # clone prompts: delayed reference rows filling the P positions
    placeholder_start: int  # index of the first P position in the prompt
    sampling: SamplingParams  # with seed resolved (never None here)
    max_frames: int  # the hard frame cap after every rule
    min_frames: int


class ScheduledChunk(NamedTuple):
    """One request's share of a step. A named tuple, not a frozen dataclass: the scheduler makes
    one per running request per step, and at hundreds of requests the dataclass's field-by-field
    init was a third of `schedule()`."""

    request_id: str
    slot: int
    start_pos: int  # tokens already computed before this step
    num_tokens: int  # tokens this step (prefill chunk, or 1 for decode)
    block_ids: tuple[int, ...]  # the request's whole block table
    samples: bool  # this step ends the prompt or is a decode: produce a row


@dataclass(frozen=True)
class StepPlan:
    step_id: int
    new_requests: tuple[NewRequestData, ...]
    chunks: tuple[ScheduledChunk, ...]  # decodes first, then prefill chunks (FCFS)
    released_slots: tuple[int, ...]  # finished/aborted since the last plan


@dataclass(frozen=True)
class StepResult:
    step_id: int
    rows: dict[str, Sequence[int]]  # request_id -> the delayed row sampled this step (8 codes; an int64 row)
    finished: tuple[str, ...]  # requests whose delay state reached done this step
