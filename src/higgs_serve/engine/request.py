"""Per-request state as the scheduler sees it: ids, counts and status. No tensors.

Token accounting (docs/model.md#delay-pattern). A request's context is its prompt plus one
position per fed row. Row 0 comes from the hidden state of the prompt's last token; row t > 0
is sampled after feeding row t−1 at position `prompt_len + t − 1`. So every sampled row is the
input of the next position, exactly like a sampled token in a text LLM:

    num_tokens = prompt_len + rows sampled so far (including rows of plans still in flight)

and each step schedules `num_tokens − num_computed_tokens` new tokens: a prompt chunk while the
prompt is not computed, then exactly 1 (the previous row) per decode step. One arithmetic
covers chunked prefill, prefix-cache hits (they only advance `num_computed_tokens`) and decode.
After a step's result, `num_computed_tokens = prompt_len + max(0, num_rows − 1)`.

Worst case: at most `max_frames` frames, then the EOC row and the 7-row ramp, so at most
`max_frames + TAIL_ROWS` rows; the last row is never fed, so the context never exceeds
`prompt_len + max_frames + TAIL_ROWS − 1` positions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from higgs_serve.errors import InvalidRequestError

if TYPE_CHECKING:
    from higgs_serve.engine.deadlines.playback_clock import PlaybackClock
    from higgs_serve.sampling_params import SamplingParams

# The EOC row plus the 7 ramp rows that follow the last frame (docs/model.md#delay-pattern).
TAIL_ROWS = 8


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"  # the runner's delay state reached done
    FINISHED_LENGTH = "finished_length"  # reached max_frames + TAIL_ROWS rows without done
    FINISHED_ABORTED = "finished_aborted"  # client abort or disconnect


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams  # seed already resolved by the engine
    max_frames: int  # hard frame cap after every rule (docs/model.md#length-caps)
    min_frames: int
    # Clone prompts: the P span of the prompt and a content hash of the reference codes, so
    # prefix-cache keys of different voices never collide. placeholder_rows are the delayed
    # reference rows ([num_placeholders][8] ints) the runner embeds at the P positions.
    placeholder_key: str | None = None
    placeholder_start: int = 0
    num_placeholders: int = 0
    placeholder_rows: tuple | None = None
    # A stream's playback clock (engine/deadlines/playback_clock.py): its deadline and slack.
    # None: no real-time listener (a file, a batch item, `synth`): the scheduler's BULK class.
    playback: PlaybackClock | None = None
    # frames it is expected to speak (the input processor's estimate from its text; 0: max_frames):
    # how long it holds its place, for the wait a new stream is told (engine/deadlines/admission.py)
    expected_frames: int = 0

    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # advanced when a chunk is scheduled
    num_rows: int = 0  # rows whose step result has been received
    num_pending_rows: int = 0  # rows of scheduled plans whose result has not arrived yet
    slot: int | None = None  # runner state row, assigned on first schedule
    # Prefix-cache content keys of the full prompt blocks (set by the scheduler at add time).
    block_keys: tuple[bytes, ...] = ()
    # Fixed at construction; plain attributes because the scheduler reads them every step.
    num_prompt_tokens: int = field(init=False)
    max_num_rows: int = field(init=False)  # max_frames + the EOC row + 7 ramp rows
    max_num_tokens: int = field(init=False)  # worst-case context: the last row is never fed

    def __post_init__(self) -> None:
        self.prompt_token_ids = tuple(self.prompt_token_ids)
        if not self.prompt_token_ids:
            raise InvalidRequestError(f"request {self.request_id}: empty prompt", "input")
        if self.max_frames < 1:
            raise InvalidRequestError(
                f"request {self.request_id}: max_frames must be >= 1, got {self.max_frames}",
                "max_new_tokens",
            )
        if self.min_frames < 0:
            raise InvalidRequestError(
                f"request {self.request_id}: min_frames must be >= 0, got {self.min_frames}",
                "min_new_tokens",
            )
        if not 0 < self.expected_frames <= self.max_frames:
            self.expected_frames = self.max_frames
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.max_num_rows = self.max_frames + TAIL_ROWS
        self.max_num_tokens = self.num_prompt_tokens + self.max_num_rows - 1
        self._check_placeholders()

    def _check_placeholders(self) -> None:
        end = self.placeholder_start + self.num_placeholders
        if self.num_placeholders < 0 or self.placeholder_start < 0 or end > self.num_prompt_tokens:
            raise InvalidRequestError(
                f"request {self.request_id}: placeholder span [{self.placeholder_start}, {end}) "
                f"is outside the {self.num_prompt_tokens}-token prompt",
                "ref_audio",
            )
        rows = self.placeholder_rows
        if rows is not None and len(rows) != self.num_placeholders:
            raise InvalidRequestError(
                f"request {self.request_id}: {len(self.placeholder_rows)} placeholder_rows for "
                f"{self.num_placeholders} placeholder positions",
                "ref_audio",
            )

    @property
    def num_tokens(self) -> int:
        """Positions whose input is known: the prompt plus every sampled row (in flight too)."""
        return self.num_prompt_tokens + self.num_rows + self.num_pending_rows
