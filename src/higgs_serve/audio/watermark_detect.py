"""Detecting the mark in audio from outside: any supported file (or headerless samples), decoded
block by block, resampled to the detector's 24 kHz as it is decoded and scored as it arrives, so
one detection holds a few tens of MB whatever the file (docs/api.md#watermark-and-provenance).
Shared by `POST /v1/audio/watermark/detect` (server/routers/watermark.py), the front end's
control plane and `higgs-serve detect`.

The verdict (docs/model.md#what-the-detector-judges) is one of three:
- `marked`: the audio is speech-like enough to judge (audio/speech_evidence.py), the network's
  score is at least THRESHOLD, and the mark is in nearly every frame it judges
  (MIN_MARKED_FRAME_FRACTION);
- `not_marked`: speech-like enough, and the score is under THRESHOLD;
- `inconclusive`: too little speech-like signal to judge (tones, chords, noise, silence, music:
  reason `too_little_speech`), or a score above the threshold from marks in part of the frames
  only (reason `marked_in_part`). `detected` is true for `marked` alone.

Messages name the caller's own options (`Naming`): the endpoint's form fields, or the CLI's flags.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import soxr

from higgs_serve.audio.decode import HEADERLESS, DecodedClip, Source, open_clip, open_headerless
from higgs_serve.audio.speech_evidence import Evidence, SpeechEvidence
from higgs_serve.audio.watermark import THRESHOLD, load_watermarker
from higgs_serve.errors import InvalidRequestError, UnreadableAudioError

# What detection accepts (the endpoint and `higgs-serve detect`): a file of at most this many
# bytes and seconds.
DETECT_MAX_BYTES = 32 * 1024 * 1024
DETECT_MAX_SECONDS = 300.0
# the rate a headerless input has unless told: what the speech endpoint sends in that encoding
HEADERLESS_DEFAULT_RATE_HZ = {"pcm": 24_000, "ulaw": 8_000, "alaw": 8_000}
# Of the frames the network judges, the share its 1x stack must score as marked before the
# verdict is `marked` (audio/perth/score.py). Chosen with the speech minimum on the calibration
# split (benchmarks/results/watermark_negatives_calibration_cpu.json; docs/model.md#what-the-detector-judges).
MIN_MARKED_FRAME_FRACTION = 0.65
MARKED, NOT_MARKED, INCONCLUSIVE = "marked", "not_marked", "inconclusive"
# why a verdict is inconclusive (the detector knows which)
TOO_LITTLE_SPEECH, MARKED_IN_PART = "too_little_speech", "marked_in_part"
# samples handed to the resampler and the scorers at a time (after decoding's own blocks)
_PUSH_SAMPLES = 65_536


@dataclass(frozen=True)
class Finding:
    verdict: str  # MARKED, NOT_MARKED or INCONCLUSIVE
    score: float  # the network's score, 0..1
    marked_frame_fraction: float
    evidence: Evidence

    @property
    def detected(self) -> bool:
        return self.verdict == MARKED

    @property
    def reason(self) -> str | None:
        """Why the verdict is inconclusive (None for the others): the rule's first unmet step."""
        if self.verdict != INCONCLUSIVE:
            return None
        return TOO_LITTLE_SPEECH if not self.evidence.speech_like else MARKED_IN_PART


@dataclass(frozen=True)
class Naming:
    """What a caller calls detection's options in its messages."""

    format: str
    sample_rate: str


ENDPOINT_NAMING = Naming("format", "sample_rate")  # POST /v1/audio/watermark/detect's form fields
CLI_NAMING = Naming("--format", "--sample-rate")  # `higgs-serve detect`'s flags


def verdict(score: float, marked_frame_fraction: float, evidence: Evidence) -> str:
    """The rule the module note states."""
    if not evidence.speech_like:
        return INCONCLUSIVE
    if score < THRESHOLD:
        return NOT_MARKED
    return MARKED if marked_frame_fraction >= MIN_MARKED_FRAME_FRACTION else INCONCLUSIVE


def open_for_detection(source: Source, param: str, encoding: str | None = None,
                       rate_hz: int | None = None, naming: Naming = ENDPOINT_NAMING) -> DecodedClip:
    """An audio file (bytes or a seekable binary file; any format audio/decode.py reads), or
    headerless samples when `encoding` is pcm, ulaw or alaw (at `rate_hz`, default that
    encoding's usual rate), header checked. InvalidRequestError names `param` (or the option,
    as `naming` calls it)."""
    *others, last = HEADERLESS
    encodings = f"{', '.join(others)} or {last}"
    if encoding is None:
        if rate_hz is not None:
            raise InvalidRequestError(f"{naming.sample_rate} is for headerless audio: give {naming.format} "
                                      f"({encodings}) too, or leave it out for a file with a header",
                                      param="sample_rate")
        try:
            return open_clip(source, param, DETECT_MAX_SECONDS, what="audio to check")
        except UnreadableAudioError as error:  # headerless samples read as a file: say how to send them
            raise InvalidRequestError(f"{error}; headerless samples (16-bit pcm, µ-law, A-law) need "
                                      f"{naming.format} ({encodings})", param=param) from error
    if encoding not in HEADERLESS:
        raise InvalidRequestError(f"{naming.format} {encoding!r} is not a headerless encoding; one of "
                                  f"{encodings} (files with a header need no {naming.format})", param="format")
    if rate_hz is None:
        rate_hz = HEADERLESS_DEFAULT_RATE_HZ[encoding]
    return open_headerless(source, encoding, rate_hz, param, DETECT_MAX_SECONDS, what="audio to check")


class LazyDetector:
    """Detection on the CPU, its model loaded at the first use (thread-safe): the endpoint and
    the CLI need no device, and never compete with the engine's mark stage for one. Any number
    of threads may detect at once (a scorer only reads the model); the server bounds how many
    (server/limits/detect_slots.py)."""

    def __init__(self, name: str = "perth"):
        self.name = name
        self._watermark = None
        self._lock = threading.Lock()

    def _model(self):
        with self._lock:
            if self._watermark is None:
                self._watermark = load_watermarker(self.name, "cpu")
            return self._watermark

    def detect_file(self, source: Source | BinaryIO, param: str, encoding: str | None = None,
                    rate_hz: int | None = None, naming: Naming = ENDPOINT_NAMING) -> Finding:
        """Decode, resample and score `source` in one pass (open_for_detection's arguments)."""
        clip = open_for_detection(source, param, encoding, rate_hz, naming)
        try:
            return self.detect_blocks(clip.blocks, clip.rate_hz, param)
        finally:
            clip.close()

    def detect(self, audio: np.ndarray, rate_hz: int) -> Finding:
        """[n] float32 mono at rate_hz -> its Finding."""
        return self.detect_blocks(iter([np.asarray(audio, dtype=np.float32)]), rate_hz, "audio")

    def detect_blocks(self, blocks, rate_hz: int, param: str) -> Finding:
        """Mono float32 blocks at rate_hz, resampled to the model's rate as they come."""
        from higgs_serve.audio.perth.score import ClipScorer  # torch: loaded with the model

        watermark = self._model()
        scorer, evidence = ClipScorer(watermark, DETECT_MAX_SECONDS), SpeechEvidence()
        target = watermark.sample_rate_hz
        resampler = soxr.ResampleStream(rate_hz, target, 1, dtype="float32") if rate_hz != target else None
        seen = 0
        for block in blocks:
            seen += block.size
            for start in range(0, block.size, _PUSH_SAMPLES):
                piece = block[start: start + _PUSH_SAMPLES]
                _feed(scorer, evidence, piece if resampler is None else resampler.resample_chunk(piece))
        if seen == 0:
            raise InvalidRequestError(f"{param} contains no audio samples", param=param)
        if resampler is not None:
            _feed(scorer, evidence, resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        detail, found = scorer.finish(), evidence.finish()
        return Finding(verdict(detail.score, detail.marked_frame_fraction, found), detail.score,
                       detail.marked_frame_fraction, found)


def _feed(scorer, evidence: SpeechEvidence, samples: np.ndarray) -> None:
    samples = np.asarray(samples, dtype=np.float32)
    scorer.push(samples)
    evidence.push(samples)
