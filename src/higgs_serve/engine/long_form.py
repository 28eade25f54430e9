"""Long-form speech: text split into segments (text/), spoken one segment after another as one
recording in one voice. Built on the engine's public `generate()`; the core never sees it.

Voice continuity: segment 0 uses the request's reference (or none: zero-shot). Each later
segment is cloned from the segment before it: its de-delayed codes and its text (tags removed)
become the reference, unless the request brought its own reference, which then conditions every
segment. A previous segment longer than MAX_REFERENCE_FRAMES is not used as a reference (the last
usable one stays), so prompts stay short and the clone prompt stays within the reference lengths
the model was trained on.

Seeds: segment k samples with seed + k (mod 2**63) when the request has a seed, so a long-form
request, a WebSocket session and the same segments sent one by one give the same audio.

Joins: each segment is a separate request and its codec windows end with it, so the first sample
of segment k+1 need not continue the last sample of segment k (a step there is a click). Codec
continuation across the join would decode segment k+1's first frames with segment k's last
frames as left context; the two are different generations, so that context would not describe
the audio that follows anyway. Instead the head of each later segment gets an offset ramp: the
difference between the previous segment's last sample and its own first sample, faded out with
a raised cosine over SEAM_RAMP_SAMPLES (10 ms). The join is then continuous, the ramp is causal
(nothing of segment k is held back, so streams lose no latency), and no sample is added or
removed, so segment timestamps are exact sums of sample counts. benchmarks/codec/bench_seam.py and
tests/server/test_long_form.py measure the step at the joins.

Total length: generation stops when the recording reaches `max_audio_samples`; the request then
finishes with reason "length".
"""

from __future__ import annotations

import hashlib
import math
import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from higgs_serve.engine.speech import ReferenceAudio, SpeechRequest
from higgs_serve.config.validators import SEED_MAX
from higgs_serve.text.segmenter import Segment
from higgs_serve.text.tags import TAG

MAX_REFERENCE_FRAMES = 750  # 30 s at 25 frames/s: peers' longest reference clip
SEAM_RAMP_SAMPLES = 240  # 10 ms at 24 kHz


@dataclass(frozen=True)
class SegmentStarted:
    index: int
    segment: Segment
    request_id: str


@dataclass(frozen=True)
class SegmentAudio:
    index: int
    audio: np.ndarray  # [n] float32, 24 kHz, already joined (seam ramp applied)


@dataclass(frozen=True)
class SegmentDone:
    index: int
    segment: Segment
    start_sample: int  # where the segment's audio starts in the recording
    end_sample: int  # one past its last sample
    num_frames: int
    finish_reason: str  # "stop" | "length" | "abort"

    def timing(self, sample_rate_hz: int) -> dict:
        """The JSON form every API surface reports (seconds and character offsets)."""
        return {"index": self.index, "char_start": self.segment.start,
                "char_end": self.segment.end,
                "start_s": round(self.start_sample / sample_rate_hz, 6),
                "end_s": round(self.end_sample / sample_rate_hz, 6),
                "num_frames": self.num_frames, "finish_reason": self.finish_reason}


LongFormEvent = SegmentStarted | SegmentAudio | SegmentDone


def segment_seed(seed: int | None, index: int) -> int | None:
    return None if seed is None else (seed + index) % (SEED_MAX + 1)


def chained_reference(frames: np.ndarray, text: str) -> ReferenceAudio:
    """A segment's own output as the clone reference of the next: codes [T, 8] + transcript."""
    codes = np.ascontiguousarray(frames, dtype=np.int64)
    transcript = " ".join(TAG.sub(" ", text).split()) or None
    return ReferenceAudio(codes=codes, ref_text=transcript,
                          content_key=hashlib.sha256(codes.tobytes()).hexdigest())


class SeamRamp:
    """Makes each segment start where the previous one ended (module doc, "Joins")."""

    def __init__(self, ramp_samples: int = SEAM_RAMP_SAMPLES):
        self.ramp_samples = ramp_samples
        self._last: float | None = None  # the last sample emitted
        self._armed = False  # a new segment began and its first sample has not been seen
        self._offset = 0.0
        self._position = ramp_samples  # samples of the current ramp already applied

    def new_segment(self) -> None:
        self._armed = self._last is not None

    def apply(self, audio: np.ndarray) -> np.ndarray:
        """[n] float32 in, [n] float32 out (a new array where the ramp touches it)."""
        if audio.size == 0:
            return audio
        if self._armed:
            self._armed = False
            self._offset, self._position = self._last - float(audio[0]), 0
        if self._position < self.ramp_samples:
            n = min(audio.size, self.ramp_samples - self._position)
            t = np.arange(self._position, self._position + n, dtype=np.float64)
            weight = 0.5 * (1.0 + np.cos(math.pi * t / self.ramp_samples))
            audio = audio.copy()
            audio[:n] += (self._offset * weight).astype(np.float32)
            self._position += n
        self._last = float(audio[-1])
        return audio


class LongFormSession:
    """Speaks segments in order as one recording (one per long-form request or WebSocket session).

    generate: the AsyncEngine `generate(request)` contract, returning a stream whose `frames`
    hold the request's codes after its final chunk.
    """

    def __init__(self, generate: Callable, base: SpeechRequest, max_audio_samples: int,
                 ramp_samples: int = SEAM_RAMP_SAMPLES):
        self._generate = generate
        self.base = base
        self.max_audio_samples = max_audio_samples
        self._own_reference = base.reference is not None
        self._reference = base.reference
        self._ramp = SeamRamp(ramp_samples)  # 0: plain concatenation (benchmarks compare)
        self.num_segments = 0
        self.num_samples = 0  # of the whole recording so far
        self.num_frames = 0
        self.done: list[SegmentDone] = []
        self.length_capped = False  # max_audio_samples was reached
        self.current_request_id: str | None = None  # the segment being spoken (to abort it)

    def request_for(self, index: int, segment: Segment) -> SpeechRequest:
        """The engine request of segment `index` (seed and reference rules: module doc)."""
        sampling = replace(self.base.sampling, seed=segment_seed(self.base.sampling.seed, index))
        return replace(self.base, request_id=f"{self.base.request_id}-{index}",
                       text=segment.model_text, sampling=sampling, reference=self._reference)

    async def speak(self, segment: Segment) -> AsyncIterator[LongFormEvent]:
        """Generate one segment: SegmentStarted, SegmentAudio..., SegmentDone. Closing the
        iterator early aborts the segment's engine request."""
        if self.length_capped:
            return
        index = self.num_segments
        self.num_segments += 1
        request = self.request_for(index, segment)
        self.current_request_id = request.request_id
        stream = self._generate(request)
        start, frames_before = self.num_samples, self.num_frames
        self._ramp.new_segment()
        reason = "abort"
        try:
            yield SegmentStarted(index, segment, request.request_id)
            async for chunk in stream:
                audio = self._fit(chunk.audio)
                self.num_frames += chunk.num_frames
                if audio.size:
                    self.num_samples += audio.size
                    yield SegmentAudio(index, self._ramp.apply(audio))
                if chunk.is_final:
                    reason = chunk.finish_reason or "stop"
                if self.length_capped:
                    reason = "length"
                    break
        finally:
            await stream.aclose()  # a no-op once finished; aborts an unfinished request
        self._chain(stream.frames if reason != "abort" else None, segment)
        done = SegmentDone(index, segment, start, self.num_samples,
                           self.num_frames - frames_before, reason)
        self.done.append(done)
        yield done

    def _fit(self, audio: np.ndarray) -> np.ndarray:
        room = self.max_audio_samples - self.num_samples
        if audio.size >= room:
            self.length_capped = True
            return audio[:max(room, 0)]
        return audio

    def _chain(self, frames: np.ndarray | None, segment: Segment) -> None:
        if self._own_reference or frames is None:
            return
        if 0 < len(frames) <= MAX_REFERENCE_FRAMES:
            self._reference = chained_reference(frames, segment.text)

    @property
    def finish_reason(self) -> str:
        """"length" if the total cap or any segment's frame cap cut speech short, else "stop"
        ("abort" if a segment was aborted)."""
        reasons = {d.finish_reason for d in self.done}
        if "abort" in reasons:
            return "abort"
        return "length" if self.length_capped or "length" in reasons else "stop"


@dataclass(frozen=True)
class LongFormAudio:
    audio: np.ndarray  # [n] float32: the whole recording
    segments: list[SegmentDone]
    num_frames: int
    finish_reason: str


def synthesize_long_form(generate: Callable, base: SpeechRequest, segments: Sequence[Segment],
                         max_audio_samples: int,
                         on_segment: Callable[[SegmentDone], None] | None = None) -> LongFormAudio:
    """Blocking: speak every segment (offline use, `higgs-serve synth`). generate: an
    AsyncEngine-style `generate(request)` (e.g. async_engine.stream_from_core bound to a core);
    on_segment: called as each segment finishes (progress)."""
    async def run() -> LongFormAudio:
        session = LongFormSession(generate, base, max_audio_samples)
        pieces = []
        for segment in segments:
            async for event in session.speak(segment):
                if isinstance(event, SegmentAudio):
                    pieces.append(event.audio)
                elif isinstance(event, SegmentDone) and on_segment is not None:
                    on_segment(event)
            if session.length_capped:
                break
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        return LongFormAudio(audio, session.done, session.num_frames, session.finish_reason)

    return asyncio.run(run())
