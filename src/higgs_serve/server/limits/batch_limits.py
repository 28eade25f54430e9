"""What one POST /v1/audio/speech/batch may hold in all: as much as one /speech request may
(docs/api.md#limits).

- Before any work: the items' `input` together at most `--max-input-chars` characters.
- While the items are spoken: their audio together at most `--max-audio-s` seconds as played
  (after `speed`), counted chunk by chunk as it reaches the items' files. The item whose audio
  passes it raises `BatchTooLarge`; the batch stops every item, discards their files and answers
  413. Each item's file (server/last_mile/audio_file.py) is on disk past 1 MiB, so the batch's disk is at
  most that much audio in its formats: 691 MB for 7,200 s of 16-bit WAV at 48 kHz, the largest.

Both are 413 `batch_too_large` with `param` `items`, never one item's error: which item passes
the total depends on how the items interleave, so the whole batch answers for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import numpy as np

from higgs_serve.server.errors import ApiError
from higgs_serve.server.settings import ServerSettings


class BatchTooLarge(ApiError):
    def __init__(self, message: str):
        super().__init__(413, message, param="items", code="batch_too_large")


def check_batch_input(items: Iterable[dict[str, Any]], settings: ServerSettings) -> None:
    """Before any item is planned: the items' input characters in all (an item whose `input`
    is not a string is its own error later, counted here as nothing)."""
    chars = sum(len(item["input"]) for item in items if isinstance(item.get("input"), str))
    if chars > settings.max_input_chars:
        raise BatchTooLarge(
            f"the batch's items hold {chars} characters of input in all; the limit is "
            f"{settings.max_input_chars} (--max-input-chars: a batch holds what one request may)"
            "; send the items in more than one batch")


class AudioBudget:
    """The batch's audio as played, counted across its items (each on the event loop)."""

    def __init__(self, settings: ServerSettings, model_rate_hz: int):
        self._limit_s = settings.max_audio_s
        self._limit_samples = settings.max_audio_s * model_rate_hz  # played, at the model's rate
        self._used_samples = 0.0  # exact for speed 1: whole numbers

    async def counted(self, audio: AsyncIterator[np.ndarray],
                      speed: float) -> AsyncIterator[np.ndarray]:
        """audio's chunks ([n] float32 at the model's rate), passed on once counted; raises
        BatchTooLarge at the chunk that takes the batch past its limit."""
        async for chunk in audio:
            self._used_samples += chunk.size / speed  # a stretch by 1/speed plays that long
            if self._used_samples > self._limit_samples:
                raise BatchTooLarge(
                    f"the batch's items made more than {self._limit_s:g} s of audio in all "
                    f"(--max-audio-s: a batch holds what one request may); every item was "
                    "stopped; send the items in more than one batch")
            yield chunk
