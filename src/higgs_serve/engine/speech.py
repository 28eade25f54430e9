"""What callers hand the engine and what they get back (no tensors: numpy arrays and ints)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from higgs_serve.codec.chunker import WindowParams
from higgs_serve.engine.deadlines.playback_clock import Playback
from higgs_serve.sampling_params import SamplingParams


@dataclass(frozen=True)
class ReferenceAudio:
    """A voice-cloning reference: de-delayed codes of the reference clip."""

    codes: np.ndarray  # [T, 8] int64
    ref_text: str | None
    content_key: str  # hash of the codes: keys prefix-cache blocks so voices never share KV


@dataclass(frozen=True)
class SpeechRequest:
    request_id: str
    text: str
    sampling: SamplingParams
    stream: bool = True  # False: exact file chunks (chunker.file_window_params) for the caller to join
    reference: ReferenceAudio | None = None
    # streaming: frames in the first audio chunk instead of the profile's (0 = the steady size)
    initial_chunk_frames: int | None = None
    # heard by a real-time player: its deadlines order the engine's work (engine/deadlines/);
    # None: no deadline (a file, a batch item, `synth`)
    playback: Playback | None = None

    def stream_window(self, profile: WindowParams) -> WindowParams:
        """The streaming window rule for this request: the profile's, with its first chunk."""
        if self.initial_chunk_frames is None:
            return profile
        return replace(profile, initial_chunk_frames=self.initial_chunk_frames)


@dataclass(frozen=True)
class AudioChunk:
    audio: np.ndarray  # [n] float32, 24 kHz mono; empty only on a final chunk
    is_final: bool
    num_frames: int  # frames this chunk covers (audio length / 960)
    finish_reason: str | None = None  # final chunk: "stop" | "length" | "abort"


@dataclass(frozen=True)
class SpeechResult:
    """Everything about one finished request (the synchronous batch helper returns these)."""

    request_id: str
    rows: np.ndarray  # [N, 8] int64: delayed rows exactly as sampled (BOC/EOC included)
    frames: np.ndarray  # [T, 8] int64: de-delayed codes handed to the codec
    audio: np.ndarray  # [T * 960] float32
    chunks: list[AudioChunk]
    finish_reason: str
    prompt_tokens: int
