"""The streaming window rule (docs/model.md#streaming-windows): which codec frames to decode, and what to keep.

Pure integer arithmetic on frame counts; no torch. One `StreamChunker` per request is fed the
number of de-delayed frames available after each talker step and answers with a `Window` when
enough new frames have accumulated:

    target  = D − H_eff                 (H_eff = H while streaming, 0 once the request finished)
    pending = target − emitted
    emit when pending ≥ threshold       (I for the first chunk when 0 < I < C, else C; with
                                        chunk doubling, min(C, emitted) after the first);
                                        the final push always emits (possibly an empty window)
    decode frames [emitted − L_eff, target + H_eff),   L_eff = min(L, emitted)
    keep the middle: cut L_eff frames (·960 samples) in front and H_eff frames at the back

The left context only feeds the decoder's receptive field; the right holdback keeps the newest
frames (whose audio the non-causal decoder would change once later frames exist) for the next
window.

Final windows at one shape (`widen_final`): a final window holds whatever was left (1 to C + H
new frames), so under the rule above every request ends at its own window shape, and a codec call
at a shape it has not seen waits for cuDNN to plan each convolution (~3 ms each on an H200, about
60 of them) while every other stream's audio queues behind it. Once a stream has L + C + H frames,
its final window is therefore widened leftwards to exactly L + C + H frames, and the codec decodes
its last C + H frames whatever the request needs: one shape, warmed up and captured at start-up,
shared by the final windows of every request. The extra decoded frames are cut, and with L at
least the decoder's left receptive field (10 frames; every shipped profile) the extra left
context changes nothing: the audio is the rule's own, to float rounding. (With a smaller L the
final chunk gets more context than the rule gives it: closer to a one-shot decode.)

Chunk doubling (docs/model.md#chunk-doubling; on in the shipped profiles): after a first chunk
of I frames the plain rule waits for C more frames, C talker steps, while a player that started at
the first audio holds only I·40 ms, so every stream ran dry once, at any load (even at c = 1).
With doubling each chunk is as long as all audio sent before it (1, 1, 2, 4, 8, 16, then C): the
player's lead grows with the stream, and a stream whose talker steps take at most 20 ms (twice
real time) never runs dry; the slack left under 20 ms covers the codec's latency. The price is a
few more codec calls per stream, all of them short windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from higgs_serve.codec.codec_config import REQUIRED_HOP_LENGTH
from higgs_serve.config.deploy import StreamingWindowConfig
from higgs_serve.config.validators import is_int

SAMPLES_PER_FRAME = REQUIRED_HOP_LENGTH  # the one hop the codec config accepts (24 kHz / 25 frames per second)
_DEFAULT = StreamingWindowConfig()  # the window defaults, written once in config/deploy.py


@dataclass(frozen=True)
class WindowParams:
    """Streaming window parameters, in frames (defaults = the shipped deploy profiles)."""

    chunk_frames: int = _DEFAULT.codec_chunk_frames  # C: steady-state chunk size
    left_context_frames: int = _DEFAULT.codec_left_context_frames  # L: frames decoded before the new ones, then cut
    right_holdback_frames: int = _DEFAULT.codec_right_holdback_frames  # H: newest frames held back until more arrive
    initial_chunk_frames: int = _DEFAULT.initial_codec_chunk_frames  # I: first-chunk size; 0 (or ≥ C) means "use C"
    chunk_doubling: bool = _DEFAULT.codec_chunk_doubling  # later chunks as long as all sent before them, up to C

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_doubling, bool):
            raise TypeError(f"WindowParams.chunk_doubling must be a bool, got {self.chunk_doubling!r}")
        for name in ("chunk_frames", "left_context_frames", "right_holdback_frames", "initial_chunk_frames"):
            value = getattr(self, name)
            if not is_int(value):
                raise TypeError(f"WindowParams.{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"WindowParams.{name} must be >= 0, got {value}")
        if self.chunk_frames < 1:
            raise ValueError(f"WindowParams.chunk_frames must be >= 1, got {self.chunk_frames}")

    @classmethod
    def from_config(cls, config: object) -> "WindowParams":
        """Read a deploy-config `StreamingWindowConfig` (or any object with its attribute names)."""
        return cls(
            chunk_frames=config.codec_chunk_frames,
            left_context_frames=config.codec_left_context_frames,
            right_holdback_frames=config.codec_right_holdback_frames,
            initial_chunk_frames=config.initial_codec_chunk_frames,
            chunk_doubling=config.codec_chunk_doubling,
        )

    def threshold(self, emitted_frames: int) -> int:
        """New frames needed before a non-final chunk is emitted."""
        if emitted_frames == 0:
            first = self.initial_chunk_frames
            return first if 0 < first < self.chunk_frames else self.chunk_frames
        if self.chunk_doubling:
            return min(self.chunk_frames, emitted_frames)
        return self.chunk_frames


class WindowShape(NamedTuple):
    """What a codec call computes: a `frames`-frame window of which frames [keep_start, keep_end)
    are kept (the decoder computes no more than those need)."""

    frames: int
    keep_start: int
    keep_end: int

    @property
    def keep(self) -> tuple[int, int]:
        return self.keep_start, self.keep_end

    @property
    def kept_frames(self) -> int:
        return self.keep_end - self.keep_start


@dataclass(frozen=True)
class Window:
    """One codec call: decode frames [start_frame, end_frame), keep the middle `new_frames`."""

    start_frame: int
    end_frame: int
    trim_front_frames: int  # left context to cut after decoding
    trim_back_frames: int  # right holdback to cut after decoding
    new_frames: int  # = end − start − trims; frames [start + trim_front, end − trim_back)
    is_final: bool
    # the first frame the codec decodes, when earlier than the first one kept (`widen_final`)
    decode_from_frame: int | None = None

    @property
    def num_frames(self) -> int:
        return self.end_frame - self.start_frame

    @property
    def shape(self) -> WindowShape:
        """What the codec computes: the window and the frames it decodes (kept ones and more)."""
        first = self.trim_front_frames if self.decode_from_frame is None else self.decode_from_frame
        return WindowShape(self.num_frames, first, self.num_frames - self.trim_back_frames)

    @property
    def new_start_frame(self) -> int:
        """First frame whose audio this window contributes to the stream."""
        return self.start_frame + self.trim_front_frames

    @property
    def trim_front_samples(self) -> int:
        return self.trim_front_frames * SAMPLES_PER_FRAME

    @property
    def trim_back_samples(self) -> int:
        return self.trim_back_frames * SAMPLES_PER_FRAME


def streaming_window_shapes(params: WindowParams) -> tuple[WindowShape, ...]:
    """Shapes of the non-final windows of a stream that gains one frame at a time, from the first
    chunk through the ramps of chunk size and left context to the first steady-state window: the
    codec shapes almost every streaming call has, worth compiling before traffic arrives."""
    chunker = StreamChunker(params)
    shapes: set[WindowShape] = set()
    steady_from = max(params.left_context_frames, params.chunk_frames)  # full left context, chunks of C
    available = 0
    while True:
        available += 1
        window = chunker.push(available, finished=False)
        if window is not None:
            shapes.add(window.shape)
            if window.new_start_frame >= steady_from:
                return tuple(sorted(shapes))


def final_window_shape(params: WindowParams) -> WindowShape:
    """The shape of every widened final window (`widen_final`): L + C + H frames, of which the
    last C + H are decoded."""
    frames = params.left_context_frames + params.chunk_frames + params.right_holdback_frames
    return WindowShape(frames, params.left_context_frames, frames)


def max_chunk_frames(params: WindowParams) -> int:
    """The most new frames one chunk holds: a final chunk takes what was held back too (C + H)."""
    return params.chunk_frames + params.right_holdback_frames


def widen_final(window: Window, params: WindowParams) -> Window:
    """A final window of a long enough stream, widened to `final_window_shape` (module doc);
    any other window unchanged."""
    shape = final_window_shape(params)
    if (not window.is_final or window.trim_back_frames or not 0 < window.new_frames <= shape.kept_frames
            or window.end_frame < shape.frames):
        return window
    return Window(window.end_frame - shape.frames, window.end_frame, shape.frames - window.new_frames, 0,
                  window.new_frames, True, decode_from_frame=shape.keep_start)


def warm_window_shapes(params: WindowParams) -> tuple[WindowShape, ...]:
    """Every codec shape a streaming request takes after its first frames, to warm up and
    capture before traffic: the ramp and steady state (`streaming_window_shapes`) and the one
    shape of widened final windows."""
    return tuple(sorted({*streaming_window_shapes(params), final_window_shape(params)}))


def file_window_params(params: WindowParams, field: tuple[int, int]) -> WindowParams:
    """The window rule of a request answered as one file: chunks of C frames with the decoder's
    whole receptive field `field` (left, right) as context on both sides, so every chunk's audio
    is what one decode of the whole clip gives it (to float rounding), however the clip is cut.
    Decoding a file chunk by chunk while it is generated, instead of in one call at its end,
    keeps every call at a few warmed-up shapes (a clip of a length the codec has not seen costs
    a cuDNN plan per convolution) and short (no stream waits behind a long clip's decode)."""
    return WindowParams(chunk_frames=params.chunk_frames, left_context_frames=field[0],
                        right_holdback_frames=field[1], initial_chunk_frames=0, chunk_doubling=False)


def ramp_first_chunks(params: WindowParams) -> tuple[int, ...]:
    """The first chunks the load may pick (`ramp_initial_frames`): the frames the profile's
    ramp has sent after each of its chunks, below C, then C. A stream that starts with one of
    them continues exactly as the profile's ramp does from there (same chunks, same left
    context), so its windows after the first have the profile's shapes, and each choice adds one
    codec shape to warm up (`first_chunk_shapes`)."""
    sizes, sent = [], 0
    while sent < params.chunk_frames:
        sent += params.threshold(sent)
        if sent < params.chunk_frames:
            sizes.append(sent)
    return (*sizes, params.chunk_frames)


def first_chunk_shapes(params: WindowParams) -> tuple[WindowShape, ...]:
    """The codec shape of each first chunk the load may pick: I new frames and the H held back,
    no left context."""
    holdback = params.right_holdback_frames
    return tuple(WindowShape(size + holdback, 0, size) for size in ramp_first_chunks(params))


def ramp_initial_frames(params: WindowParams, step_us: int, frame_us: int, stage1_us_per_frame: int = 0,
                        jitter_us: int = 0) -> int:
    """The first chunk of a stream whose talker steps take `step_us`, whose windows take
    `stage1_us_per_frame` more on their way to the listener for each frame they carry, and whose
    way there varies by up to `jitter_us` (docs/architecture.md#deadlines).

    A chunk of E new frames with S frames sent before it is cut (S + E − I) steps after the first
    chunk (I frames; the held-back frames came with the first) and reaches the listener
    (E − I) · stage1_us_per_frame later than the first did, while a player that started at the
    first audio runs dry S frame periods after it: the ramp keeps up while

        (S + E − I) · step_us + (E − I) · stage1_us_per_frame + jitter_us ≤ S · frame_us

    for every chunk. With doubling (E = S) that holds at any I while a step and half a frame's
    Stage 1 time take at most half a frame period; slower ones need a larger I. Returns the
    smallest of `ramp_first_chunks` whose ramp keeps up, or C: steps of a frame period or more
    keep no ramp ahead (only admission helps)."""
    if step_us >= frame_us:
        return params.chunk_frames
    for size in ramp_first_chunks(params):
        if _ramp_keeps_up(params, size, step_us, frame_us, stage1_us_per_frame, jitter_us):
            return size
    return params.chunk_frames


def _ramp_keeps_up(params: WindowParams, first: int, step_us: int, frame_us: int, stage1_us_per_frame: int,
                   jitter_us: int) -> bool:
    sent = first
    while True:
        new = params.threshold(sent)
        late_us = (sent + new - first) * step_us + (new - first) * stage1_us_per_frame + jitter_us
        if late_us > sent * frame_us:
            return False
        if new == params.chunk_frames:  # steady chunks: each later one has more lead than this
            return True
        sent += new


NEVER = 1 << 62  # a frame count no request reaches


class StreamChunker:
    """Per-request window state: `emitted` frames already handed to the audio stream."""

    def __init__(self, params: WindowParams | None = None, streaming: bool = True) -> None:
        self.params = params if params is not None else WindowParams()
        self.streaming = streaming
        self.emitted_frames = 0
        self.frames_seen = 0
        self.finished = False
        self.due_frames = self._due()

    def _due(self) -> int:
        """The fewest available frames at which a non-final `push` returns a window (NEVER when
        not streaming): callers may skip the push below it."""
        if not self.streaming:
            return NEVER
        return self.emitted_frames + self.params.threshold(self.emitted_frames) + self.params.right_holdback_frames

    def push(self, num_frames_available: int, finished: bool) -> Window | None:
        """Report D de-delayed frames available; returns the window to decode now, if any."""
        self._check_push(num_frames_available)
        self.frames_seen = num_frames_available
        if not finished:
            return self._streaming_window(num_frames_available) if self.streaming else None
        self.finished = True
        return self._final_window(num_frames_available)

    def _check_push(self, num_frames_available: int) -> None:
        if self.finished:
            raise RuntimeError("StreamChunker.push called after the final window was emitted")
        if num_frames_available < self.frames_seen:
            raise ValueError(
                f"num_frames_available went backwards: {num_frames_available} < {self.frames_seen}"
            )

    def _streaming_window(self, available: int) -> Window | None:
        holdback = self.params.right_holdback_frames
        target = max(0, available - holdback)
        if target - self.emitted_frames < self.params.threshold(self.emitted_frames):
            return None
        return self._emit(target, holdback, is_final=False)

    def _final_window(self, available: int) -> Window:
        if available <= self.emitted_frames:
            # Nothing new: an empty final window still tells the consumer the stream ended.
            at = self.emitted_frames
            return Window(at, at, 0, 0, 0, is_final=True)
        if not self.streaming:
            self.emitted_frames = available
            return Window(0, available, 0, 0, available, is_final=True)
        return self._emit(available, 0, is_final=True)

    def _emit(self, target: int, holdback: int, is_final: bool) -> Window:
        left = min(self.params.left_context_frames, self.emitted_frames)
        window = Window(
            start_frame=self.emitted_frames - left,
            end_frame=target + holdback,
            trim_front_frames=left,
            trim_back_frames=holdback,
            new_frames=target - self.emitted_frames,
            is_final=is_final,
        )
        self.emitted_frames = target
        self.due_frames = self._due()
        return window
