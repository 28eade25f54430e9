"""Output processing: each step's delayed rows → frames → codec windows → audio chunks.

Contract (the engine loop is the only caller of `emit`; any thread may call the others):
- `open(request_id, stream, sink, max_frames, prompt_tokens)`: start collecting a request's
  rows; its chunks go to `sink` (through `sink_wrapper` when one is set: the watermark stage,
  engine/mark_stage.py, which marks every chunk before the sink sees it). `stream` picks the
  streaming window rule, else the exact file-chunk rule (codec/chunker.py: `file_window_params`).
- `emit(rows, finished)`: once per step: append each request's row, hand every window the rule
  says is due to the codec (Stage 1, its own thread), and for a finished request hand its rows
  and frames to the sink (`ChunkSink.finish`) and forget it. Rows of unknown (aborted) requests
  are dropped.
- `close(request_id)` / `close_all()`: forget requests (abort, engine death), returning their
  sinks so the caller can tell them.
- `audio_sent(request_id, samples, at_us)`: the caller's report that a stream's audio left.
Chunks of a stream tell `on_lead(at_us, lead_us, losing)` how its listener fares (`lead_report`:
its steady chunks the lead the listener had just before each and whether that shrank since the
previous chunk; its first the time left in its first-audio budget since its admission) (the deadline policy's stream limit, engine/deadlines/stream_limit.py): from the
caller's reports when it makes them, else from deliveries to its sink.
Streams (a request with a playback clock, engine/deadlines/playback_clock.py): the window rule is
the profile's with the first chunk the load needs (`stream_window`, the deadline policy's), asked
at `open` (so the policy can predict the first audio at arrival) and again when the stream's
first row arrives, for the load it then joins (the streams of a burst are all admitted by then,
and a ramp planned for the first of them alone would not hold once all run); the clock learns when the next window is due (`due_rows`), each window goes to the
codec with the stream's deadline (the codec and the mark stage serve the earliest first), each
chunk that reaches the caller's sink counts as sent unless the caller reports sends, and the
window's time from hand-off to the sink is Stage 1's measured latency (stage1_load.py).
Chunks reach the sink from the codec thread, in order, the last with `is_final` and the finish
reason ("stop": natural end, "length": the frame cap). No tensors here: rows are a growing int64
NumPy array per request.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from higgs_serve.codec.chunker import SAMPLES_PER_FRAME, StreamChunker, Window, WindowParams, widen_final
from higgs_serve.codec.codec_runner import CodecJob, CodecRunner
from higgs_serve.engine.deadlines.playback_clock import STALL_US, PlaybackClock, now_us
from higgs_serve.engine.deadlines.stage1_load import Stage1Load
from higgs_serve.engine.speech import AudioChunk, SpeechRequest
from higgs_serve.model.delay_pattern import frames_until_eoc, num_complete_frames, revert_delay, sanitize_codes


# (at_us, lead_us, losing): a stream's chunk left with its listener lead_us ahead, losing ground or
# not (`lead_report`)
LeadReport = Callable[[int, int, bool], None]


def lead_report(clock: PlaybackClock, first: bool, lead_us: int, at_us: int, samples: int,
                steady_samples: int) -> tuple[int, bool] | None:
    """What a chunk tells the stream limit (engine/deadlines/stream_limit.py), or None:
    - the first, for a stream with a first-audio budget: the time its budget leaves, counted from
      its admission (a wait in the queue says the limit is low, not that too many run), and
      losing when that is below 0;
    - a steady chunk (`steady_samples`, the profile's chunk, or more): the lead its listener had
      and whether that shrank since the previous chunk. Steady chunks are where a stream shows
      whether the engine keeps it ahead of real time; the ramp's chunks before them run close to
      their listener by design (codec/chunker.py), so their leads say little
    - a ramp chunk only when its listener already waited for it more than half a stall."""
    if first:
        if clock.ttfa_budget_us is None:
            return None
        start = clock.admitted_us if clock.admitted_us is not None else clock.submitted_us
        left = start + clock.ttfa_budget_us - at_us
        return left, left < 0
    if samples >= steady_samples:
        change = clock.lead_change_us
        return lead_us, change is not None and change < 0
    if lead_us < -STALL_US // 2:
        return lead_us, True
    return None


class ChunkSink(Protocol):
    """Where one request's output goes. Called from the engine and codec threads."""

    def put(self, chunk: AudioChunk) -> None: ...

    def fail(self, error: BaseException) -> None: ...

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None: ...


class RequestOutput:
    """One request's delayed rows on the host and its window state."""

    def __init__(self, params: WindowParams, streaming: bool, num_codebooks: int, codebook_size: int):
        self.streaming = streaming
        self.chunker = StreamChunker(params, streaming=streaming)
        self.codebook_size = codebook_size
        self._rows = np.zeros((64, num_codebooks), dtype=np.int64)
        self.num_rows = 0

    def replan(self, params: WindowParams) -> None:
        """A new window rule before any frame was cut (a stream's first chunk, planned again)."""
        self.chunker = StreamChunker(params, streaming=self.streaming)

    def append(self, row: Sequence[int]) -> None:
        if self.num_rows == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._rows[self.num_rows] = row
        self.num_rows += 1

    @property
    def rows(self) -> np.ndarray:
        """[N, 8] int64: the delayed rows exactly as sampled."""
        return self._rows[: self.num_rows]

    def frames_available(self, finished: bool) -> int:
        """Complete de-delayed frames; once finished, the EOC frame of a natural end is dropped."""
        complete = num_complete_frames(self.num_rows, self._rows.shape[1])
        # the EOC frame (natural end, or the forced end at the frame cap) is never decoded
        return frames_until_eoc(self._rows, complete, self.codebook_size) if finished else complete

    def window_may_be_due(self, finished: bool) -> bool:
        """Whether `next_window` can return a window: a streaming window needs the chunker's
        `due_frames` complete frames, so below that the window rule is not asked (at hundreds of
        requests a step, asking it every step was most of the output bookkeeping)."""
        return finished or self.frames_available(False) >= self.chunker.due_frames

    def next_window(self, finished: bool) -> tuple[Window, np.ndarray] | None:
        """The next codec window (if the rule says one is due) and its frames [T, 8]."""
        window = self.chunker.push(self.frames_available(finished), finished)
        if window is None:
            return None
        window = widen_final(window, self.chunker.params)
        return window, self.frames(window.start_frame, window.end_frame)

    def all_frames(self) -> np.ndarray:
        """[T, 8] int64: every frame handed to the codec (specials replaced by 0)."""
        return self.frames(0, self.frames_available(True))

    def frames(self, start: int, end: int) -> np.ndarray:
        """Frames [start, end) as [T, 8] int64, any special code left (BOC/EOC) replaced by 0."""
        frames = revert_delay(self._rows, start, end, self._rows.shape[1])
        return sanitize_codes(frames, self.codebook_size)


class _ClockedSink:
    """A stream's sink as Stage 1 sees it: each chunk that reaches the caller counts as
    delivered on the stream's clock, and its window's way through Stage 1 is timed."""

    def __init__(self, sink: ChunkSink, clock: PlaybackClock, stage1: Stage1Load, on_lead: LeadReport | None,
                 steady_samples: int, now: Callable[[], int] = now_us):
        self._sink = sink
        self.clock = clock
        self._steady_samples = steady_samples
        self._now = now
        self._stage1 = stage1
        self._on_lead = on_lead
        self.handed_off_us: deque[int] = deque()  # per window in Stage 1, oldest first

    def put(self, chunk: AudioChunk) -> None:
        at = self._now()
        if self.handed_off_us:
            self._stage1.window_done(at - self.handed_off_us.popleft())
        clock = self.clock
        first = not clock.has_deliveries
        lead = clock.delivered(chunk.audio.size, at)
        if not clock.has_sends:  # nobody reports sends: what reached the sink is what was heard
            self._report(first, lead, at, chunk.audio.size)
        self._sink.put(chunk)

    def sent(self, samples: int, at_us: int) -> None:
        """The caller's report that `samples` of this stream left at `at_us`."""
        first = not self.clock.has_sends
        self._report(first, self.clock.sent(samples, at_us), at_us, samples)

    def _report(self, first: bool, lead_us: int, at_us: int, samples: int) -> None:
        if samples > 0 and self._on_lead is not None:
            report = lead_report(self.clock, first, lead_us, at_us, samples, self._steady_samples)
            if report is not None:
                self._on_lead(at_us, *report)

    def fail(self, error: BaseException) -> None:
        self._sink.fail(error)

    def finish(self, rows: np.ndarray, frames: np.ndarray, finish_reason: str, prompt_tokens: int) -> None:
        self._sink.finish(rows, frames, finish_reason, prompt_tokens)


@dataclass
class _Open:
    out: RequestOutput
    sink: ChunkSink
    max_frames: int
    prompt_tokens: int
    clocked: _ClockedSink | None = None  # a stream's: its clock and Stage 1 timing
    replan: bool = False  # its first chunk is planned again at its first row (module note)


class OutputProcessor:
    def __init__(self, codec: CodecRunner, window: WindowParams, file_window: WindowParams, async_chunk: bool,
                 num_codebooks: int, codebook_size: int,
                 sink_wrapper: Callable[..., ChunkSink] | None = None,
                 stream_window: Callable[[WindowParams, float], WindowParams] | None = None,
                 stage1: Stage1Load | None = None, on_lead: LeadReport | None = None,
                 clock: Callable[[], int] = now_us):
        """`clock`: the time in µs (a simulation passes its own)."""
        self.codec = codec
        # every request's sink passes through this (the watermark stage's `wrap(sink, deadline)`),
        # if set
        self.sink_wrapper = sink_wrapper
        # a stream's window: (the profile's, speed) -> the one the load needs (the deadline policy's)
        self.stream_window = stream_window
        self.stage1 = stage1 if stage1 is not None else Stage1Load(())
        self.on_lead = on_lead  # per stream chunk after the first (module note)
        self.now_us = clock
        self.window = window
        self.steady_samples = window.chunk_frames * SAMPLES_PER_FRAME  # a steady chunk's audio
        # a request answered as one file is decoded in exact chunks as it is generated
        # (chunker.file_window_params); its sink collects them
        self.file_window = file_window
        # async_chunk false: codes go to the codec only once a request ends (one chunk each)
        self.async_chunk = async_chunk
        self.num_codebooks = num_codebooks
        self.codebook_size = codebook_size
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._open

    def request_ids(self) -> list[str]:
        return list(self._open)

    def open(self, speech: SpeechRequest, sink: ChunkSink, max_frames: int, prompt_tokens: int,
             clock: PlaybackClock | None = None) -> None:
        """`clock`: a stream's playback clock (the scheduler's request carries the same one)."""
        out = RequestOutput(self._window(speech), self.async_chunk, self.num_codebooks, self.codebook_size)
        clocked = None
        if clock is not None:
            sink = clocked = _ClockedSink(sink, clock, self.stage1, self.on_lead, self.steady_samples, self.now_us)
            self._set_due(clock, out, max_frames)
        if self.sink_wrapper is not None:
            sink = self.sink_wrapper(sink, clock.deadline_us if clock is not None else None)
        with self._lock:  # the caller has checked the id is not open already
            self._open[speech.request_id] = _Open(out, sink, max_frames, prompt_tokens, clocked,
                                                  replan=clock is not None and self._follows_load(speech))

    def _follows_load(self, speech: SpeechRequest) -> bool:
        """A stream whose first chunk the deadline policy picks (its own one is kept as given)."""
        return (speech.stream and speech.initial_chunk_frames is None and speech.playback is not None
                and self.stream_window is not None)

    def _window(self, speech: SpeechRequest) -> WindowParams:
        if not speech.stream:
            return self.file_window
        if self._follows_load(speech):
            return self.stream_window(self.window, speech.playback.speed)
        return speech.stream_window(self.window)

    def _replan(self, entry: _Open) -> None:
        """At a stream's first row: its first chunk for the load it joins (module note)."""
        entry.replan = False
        clock = entry.clocked.clock
        entry.out.replan(self.stream_window(self.window, clock.speed))
        self._set_due(clock, entry.out, entry.max_frames)

    def _set_due(self, clock: PlaybackClock, out: RequestOutput, max_frames: int) -> None:
        """The rows at which the stream's next window is due (its last frame's, when the rule
        waits for the end)."""
        clock.due_rows = min(out.chunker.due_frames, max_frames) + self.num_codebooks - 1

    def audio_sent(self, request_id: str, samples: int, at_us: int) -> None:
        """The caller sent `samples` more of a stream at `at_us` (unknown or finished: ignored)."""
        entry = self._open.get(request_id)
        if entry is not None and entry.clocked is not None:
            entry.clocked.sent(samples, at_us)

    def close(self, request_id: str) -> ChunkSink | None:
        with self._lock:
            entry = self._open.pop(request_id, None)
        return entry.sink if entry is not None else None

    def close_all(self) -> list[ChunkSink]:
        with self._lock:
            entries, self._open = list(self._open.values()), {}
        return [e.sink for e in entries]

    def emit(self, rows: dict[str, Sequence[int]], finished: set[str]) -> None:
        for rid, row in rows.items():
            entry = self._open.get(rid)
            if entry is None:  # aborted while its step was in flight
                continue
            if entry.replan:
                self._replan(entry)
            entry.out.append(row)
            done = rid in finished
            if entry.out.window_may_be_due(done):
                self._advance(rid, entry, done)
        for rid in finished - rows.keys():  # finished without a row this step
            entry = self._open.get(rid)
            if entry is not None:
                self._advance(rid, entry, True)

    def _advance(self, request_id: str, entry: _Open, done: bool) -> None:
        """Hand the codec the request's window if one is due; finish it when done."""
        nxt = entry.out.next_window(done)
        reason = self._finish(request_id, entry) if done else None  # a finished request's window is final
        if nxt is None:
            return
        deadline = None
        if entry.clocked is not None:
            self._set_due(entry.clocked.clock, entry.out, entry.max_frames)
            entry.clocked.handed_off_us.append(self.now_us())
            deadline = entry.clocked.clock.deadline_us()
        self._submit_window(request_id, entry.sink, *nxt, reason, deadline)

    def _finish(self, request_id: str, entry: _Open) -> str:
        """Hand the finished request's rows and frames to its sink; returns the finish reason."""
        frames = entry.out.all_frames()
        reason = "length" if len(frames) >= entry.max_frames else "stop"
        self.close(request_id)
        entry.sink.finish(entry.out.rows.copy(), frames, reason, entry.prompt_tokens)
        return reason

    def _submit_window(self, request_id: str, sink: ChunkSink, window: Window, frames: np.ndarray,
                       reason: str | None, deadline_us: int | None) -> None:
        def deliver(job: CodecJob, audio: np.ndarray | None, error: BaseException | None = None) -> None:
            if error is not None:
                sink.fail(error)
                return
            sink.put(AudioChunk(audio, job.is_final, window.new_frames, reason))

        self.codec.submit(
            CodecJob(
                request_id=request_id,
                frames=frames,
                trim_front_frames=window.trim_front_frames,
                trim_back_frames=window.trim_back_frames,
                is_final=window.is_final,
                deliver=deliver,
                decode_from_frames=window.decode_from_frame,
                deadline_us=deadline_us,
            )
        )
