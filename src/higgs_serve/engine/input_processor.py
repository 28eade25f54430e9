"""Input processing: a `SpeechRequest` in, the scheduler's `Request` out.

Contract: `InputProcessor.process(speech) -> ProcessedInput` resolves the seed, tokenizes the
text, builds the prompt (zero-shot, or a clone prompt whose placeholder positions carry the
reference codes after the delay pattern), and fixes the request's frame limits (the length rules
below). It reads nothing but its own frozen fields, so any thread may call it; it raises
`InvalidRequestError` (with `param`) for a request that can never be served as asked: a
`min_new_tokens` above the text's frame cap (or above what max_model_len leaves) is refused with
the limit named.

Length rules (docs/architecture.md, "Length caps"):
    max_frames = min(max_new_tokens, text cap, max(max_model_len - prompt_len - TAIL_ROWS, 1))
    min_frames = min(max(MIN_FRAMES, min_new_tokens), max_frames)
The profile's `max_tokens` already bounds `max_new_tokens` (SamplingParams.from_defaults).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from higgs_serve.engine.deadlines.playback_clock import clock_for
from higgs_serve.engine.request import TAIL_ROWS, Request
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.errors import InvalidRequestError
from higgs_serve.model.delay_pattern import apply_delay
from higgs_serve.model.prompt import PromptBuilder

# Minimum-length rule (docs/model.md, "Length rules"): an utterance spans at least one full
# delay window.
MIN_FRAMES = 8
# Normal speech runs at 3-4 text tokens a second: a request's expected length, for the wait a new
# stream is told (engine/deadlines/admission.py), never a limit.
SPOKEN_TOKENS_PER_S = 3.5


def text_frame_cap(num_text_tokens: int, frame_rate: int) -> int:
    """Frame cap derived from the text: 4 s of slack plus 0.5 s per text token, at `frame_rate`
    frames per second.

    Normal speech runs at 3-4 tokens per second, so this is about three times the expected
    length: long enough for slow, expressive reads, short enough that a model that fails to stop
    never produces a minute of silence for a short sentence.
    """
    return math.ceil(frame_rate * (4 + 0.5 * num_text_tokens))


@dataclass(frozen=True)
class ProcessedInput:
    request: Request  # what the scheduler admits
    prompt_tokens: int  # prompt length in tokens (usage)


@dataclass(frozen=True)
class InputProcessor:
    prompts: PromptBuilder
    max_model_len: int  # prompt + generated rows
    frame_rate: int  # codec frames per second (the checkpoint's codec config)
    num_codebooks: int  # the checkpoint's audio config
    codebook_size: int  # per-codebook vocabulary, BOC and EOC included
    sample_rate_hz: int = 24000  # the codec's: a stream's playback clock counts its samples

    def process(self, speech: SpeechRequest) -> ProcessedInput:
        sampling = speech.sampling
        if sampling.seed is None:
            sampling = sampling.with_seed(secrets.randbits(63))
        prompt, placeholder = self._prompt(speech)
        num_text_tokens = self.prompts.count_text_tokens(speech.text)
        max_frames, min_frames = self._frame_limits(speech, len(prompt), num_text_tokens)
        expected = math.ceil(self.frame_rate * num_text_tokens / SPOKEN_TOKENS_PER_S)
        request = Request(
            request_id=speech.request_id,
            prompt_token_ids=tuple(prompt),
            sampling=sampling,
            max_frames=max_frames,
            min_frames=min_frames,
            playback=clock_for(speech.playback, self.sample_rate_hz),
            expected_frames=min(max_frames, max(min_frames, expected)),
            **placeholder,
        )
        return ProcessedInput(request, len(prompt))

    def _prompt(self, speech: SpeechRequest) -> tuple[list[int], dict]:
        """The prompt's token ids, and for a clone prompt the `Request` fields of its placeholder
        span (the reference's delayed rows, keyed by the reference's content hash)."""
        if speech.reference is None:
            return self.prompts.zero_shot(speech.text), {}
        ref_rows = apply_delay(speech.reference.codes, self.codebook_size, self.num_codebooks)
        clone = self.prompts.clone(speech.text, len(ref_rows), speech.reference.ref_text)
        return clone.token_ids, dict(
            placeholder_key=speech.reference.content_key,
            placeholder_start=clone.placeholder_start,
            num_placeholders=clone.num_placeholders,
            placeholder_rows=tuple(map(tuple, ref_rows.tolist())),
        )

    def _frame_limits(self, speech: SpeechRequest, prompt_len: int, num_text_tokens: int) -> tuple[int, int]:
        """(max_frames, min_frames) after every length rule. A `min_new_tokens` above a cap is
        refused, never silently lowered: it promises that the audio does not end earlier."""
        sampling = speech.sampling
        text_cap = text_frame_cap(num_text_tokens, self.frame_rate)
        # the EOC row and the ramp follow the last frame (the scheduler's worst-case context)
        room = self.max_model_len - prompt_len - TAIL_ROWS
        if sampling.min_new_tokens > text_cap:
            raise InvalidRequestError(
                f"min_new_tokens={sampling.min_new_tokens} is above the frame limit of this text: "
                f"{text_cap} frames ({num_text_tokens} text tokens allow 4 s plus 0.5 s per token, at "
                f"{self.frame_rate} frames per second); lower min_new_tokens or give a longer text",
                param="min_new_tokens")
        if room >= 1 and sampling.min_new_tokens > room:
            raise InvalidRequestError(
                f"min_new_tokens={sampling.min_new_tokens} is above the {room} frames that "
                f"max_model_len={self.max_model_len} leaves after this prompt of {prompt_len} tokens",
                param="min_new_tokens")
        max_frames = min(sampling.max_new_tokens, text_cap, max(room, 1))
        min_frames = min(max(MIN_FRAMES, sampling.min_new_tokens), max_frames)
        return max_frames, min_frames
