"""Request and response bodies of the HTTP API (pydantic), the OpenAPI schema's source.

Requests are strict (`"1"` is not an int) and closed (`extra="forbid"`): a field the server does
not know is a 400 that names it, never silently dropped; `null` for an optional field is the
same as leaving it out (`PeerModel`). Checks that need the running server
(served model name, input length limit, registered voices, profile limits) live in
server/plan/speech_plan.py.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from higgs_serve.audio.time_stretch import MAX_SPEED, MIN_SPEED
from higgs_serve.server.peer_fields import (
    UNSUPPORTED_FIELDS,
    normalise_language,
    normalise_task_type,
)
from higgs_serve.errors import InvalidRequestError
from higgs_serve.voices.codes_file import (
    MAX_REFERENCE_FRAMES,
    NUM_CODEBOOKS,
    check_reference_codes,
)

ResponseFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw"]
StreamFormat = Literal["audio", "sse"]


class PeerModel(BaseModel):
    """Strict and closed, and `null` for an optional field means "not given" (its default), as
    vllm-omni and sglang-omni clients send it (e.g. `"voice": null`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {key: value for key, value in data.items()
                if value is not None
                or (key in fields and fields[key].is_required())
                or (key not in fields and key not in UNSUPPORTED_FIELDS)}


def unicode_text(value: str) -> str:
    """`value` if it is valid Unicode: JSON's escapes can spell a lone surrogate (\\ud800),
    which Python keeps but the tokenizer and the sentence splitter cannot encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"holds a lone surrogate ({value[error.start]!r} at character "
                         f"{error.start}): not valid Unicode text") from None
    return value


class ReferenceClip(PeerModel):
    """One entry of `references` (Boson's cloning shape): one audio field + its transcript."""

    audio_path: str | None = Field(default=None, description="A local path or file:// URL "
                                   "(under --allowed-local-media-path), URL, data URI or base64.")
    ref_audio: str | None = Field(default=None, description="Same forms as audio_path.")
    audio: str | None = Field(default=None, description="Same forms as audio_path.")
    data: str | None = Field(default=None, description="Base64 audio bytes (or a data: URI).")
    media_type: str | None = Field(default=None, description="audio/* type of `data`/`audio`; "
                                   "checked, the bytes themselves are identified by content.")
    text: str | None = Field(default=None, description="Transcript of the clip.")

    @model_validator(mode="after")
    def _one_audio(self) -> ReferenceClip:
        given = [name for name in REFERENCE_AUDIO_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("a reference needs exactly one of audio_path, ref_audio, audio, "
                             f"data (got {', '.join(given) or 'none'})")
        if self.media_type is not None and not self.media_type.startswith("audio/"):
            raise ValueError(f"media_type must be an audio/* type, got {self.media_type!r}")
        return self

    @field_validator("text")
    @classmethod
    def _text_is_unicode(cls, value: str) -> str:
        return unicode_text(value)

    def source(self) -> tuple[str, str]:
        """(the audio value, the name of the field it came in)."""
        name = next(name for name in REFERENCE_AUDIO_FIELDS if getattr(self, name) is not None)
        return getattr(self, name), name


REFERENCE_AUDIO_FIELDS = ("audio_path", "ref_audio", "audio", "data")


class SpeechFields(PeerModel):
    """Every optional field of a speech request (shared by /speech and /speech/batch)."""

    model: str | None = Field(
        default=None, description="One of the served model names or the model path/hub id it "
        "was started with; may be omitted.")
    voice: str = Field(
        default="default", description="'default' (zero-shot), a voice registered through "
        "POST /v1/audio/voices (a name, or {\"id\": name}), or an alias the server maps to one "
        "(--voice-alias). OpenAI's stock voice names are a 400 unless aliased.")
    speaker: str | None = Field(default=None, description="Alias of voice (vllm-omni).")
    response_format: ResponseFormat = Field(
        default="wav", description="wav (default), pcm (raw s16le), flac, mp3, opus (Ogg), aac "
        "(ADTS), ulaw or alaw (G.711, headerless, 8 kHz unless sample_rate says otherwise). "
        "Every format streams as it is made unless stream is false (wav and flac: only "
        "with stream true or a stream_format).")
    speed: float = Field(
        default=1.0, ge=MIN_SPEED, le=MAX_SPEED,
        description="Playback speed via pitch-preserving time stretch (streamed too).")
    sample_rate: int | None = Field(
        default=None, description="Output rate in Hz, resampled from the model's 24000: one of "
        "8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000 (opus: 8000, 16000, 24000, "
        "48000). Default 24000; ulaw and alaw 8000.")
    instructions: str | None = Field(
        default=None, description="Not supported by Higgs-Audio V3: a non-empty value is a 400.")
    task_type: str | None = Field(
        default=None, description="vllm-omni's task type; only 'Base' (zero-shot or cloning).")
    language: str | None = Field(
        default=None, description="'auto' or a language of the model card (name or ISO code). "
        "Higgs infers the language from the text; the value is checked and echoed in X-Language.")
    max_new_tokens: int | None = Field(
        default=None, ge=1, description="Cap on generated audio frames (25 per second).")
    min_new_tokens: int | None = Field(
        default=None, ge=0, description="Frames before the model may stop (benchmarks).")
    seed: int | None = Field(
        default=None, ge=0, lt=2**63, description="Same seed + same request = same audio.")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, description="0 disables top-k.")
    ref_audio: str | None = Field(
        default=None, description="Reference clip for cloning: base64, a data: URI, an http(s) "
        "URL on the server's allow-list, or a local path / file:// URL under "
        "--allowed-local-media-path.")
    ref_text: str | None = Field(default=None, description="Transcript of ref_audio.")
    references: list[ReferenceClip] | None = Field(
        default=None, description="Boson's cloning shape: exactly one {audio_path | ref_audio | "
        "audio | data, media_type, text}.")
    reference_codes: list[list[int]] | None = Field(
        default=None, description="A pre-encoded reference: [T, 8] codec codes 0-1023 (as "
        "`higgs-serve encode-voice` writes them), T <= 750 (30 s).")
    reference_text: str | None = Field(default=None, description="Transcript of reference_codes.")
    word_timestamps: bool = Field(
        default=False, description="Word timestamps [{word, start_ms, end_ms}] by forced "
        "alignment (English): the X-Word-Timestamps header of a file (a raw stream asking for "
        "them is sent whole, as a file), speech.words events on SSE, audio.chunk frames on the "
        "WebSocket. Not on /v1/audio/speech/batch.")
    initial_codec_chunk_frames: int | None = Field(
        default=None, ge=0, description="Streaming only: frames in the first audio chunk "
        "(0 = the steady chunk size; at most the profile's codec_chunk_frames).")

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_object(cls, value: Any) -> Any:
        """vllm-omni's voice object {"id": name} is the name."""
        if not isinstance(value, dict):
            return value
        if set(value) == {"id"} and isinstance(value["id"], str):
            return value["id"]
        raise ValueError('must be a voice name or {"id": "<name>"}')

    @field_validator("references")
    @classmethod
    def _one_reference(cls, value: list[ReferenceClip]) -> list[ReferenceClip]:
        if len(value) != 1:
            raise ValueError(f"one reference per request: got {len(value)}; Higgs-Audio V3 "
                             "clones from a single clip")
        return value

    @field_validator("reference_codes", mode="before")
    @classmethod
    def _codes_size(cls, value: Any) -> Any:
        """The shape from the raw lists, before any code is validated: validating every element
        of an oversize list first cost time that grew with the list (issue 40 item 2)."""
        if not isinstance(value, list):
            return value  # the type error is pydantic's
        if len(value) > MAX_REFERENCE_FRAMES:
            raise ValueError(f"must hold 1-{MAX_REFERENCE_FRAMES} frames (30 s), got {len(value)}")
        bad_rows = [i for i, row in enumerate(value)
                    if isinstance(row, list) and len(row) != NUM_CODEBOOKS]
        if bad_rows:
            raise ValueError(f"must have shape [T, {NUM_CODEBOOKS}]: frame {bad_rows[0]} has "
                             f"{len(value[bad_rows[0]])} codes")
        return value

    @field_validator("reference_codes")
    @classmethod
    def _codes_shape(cls, value: list[list[int]]) -> list[list[int]]:
        try:  # the same rule as `synth --ref-codes` files
            codes = np.asarray(value, dtype=np.int64).reshape(-1, NUM_CODEBOOKS)
        except OverflowError as error:
            raise ValueError("codes must be 0-1023 (a value does not fit 64 bits)") from error
        try:
            check_reference_codes(codes, "reference_codes")
        except InvalidRequestError as error:
            raise ValueError(str(error).removeprefix("reference_codes ")) from error
        return value

    @field_validator("ref_text", "reference_text")
    @classmethod
    def _transcript_is_unicode(cls, value: str) -> str:
        return unicode_text(value)

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        return normalise_language(value)

    @field_validator("task_type")
    @classmethod
    def _task_type(cls, value: str) -> str:
        return normalise_task_type(value)


class SpeechRequestBody(SpeechFields):
    """POST /v1/audio/speech."""

    input: str = Field(min_length=1, description="Text to speak (non-empty; length-capped).")
    stream: bool | None = Field(
        default=None, description="true: the audio streams as it is generated, in every format "
        "(raw bytes unless stream_format is 'sse'). false: one file with its Content-Length, made "
        "with the file windows. Left out: streamed, as OpenAI's endpoint does, except wav and "
        "flac without a stream_format, which are the file (their header states the length).")
    stream_format: StreamFormat | None = Field(
        default=None, description="'audio' (raw chunked bytes of response_format, the default) "
        "or 'sse' (speech.audio.* events carrying them in base64).")

    @field_validator("input")
    @classmethod
    def _input_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must contain non-whitespace text")
        return unicode_text(value)


MAX_BATCH_ITEMS = 32


class SpeechBatchRequest(SpeechFields):
    """POST /v1/audio/speech/batch: every field of a speech request is a default for the items."""

    items: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_BATCH_ITEMS,
        description="1-32 objects with `input` and any speech field (overriding the defaults); "
        "never streamed.")


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class BatchItemResult(BaseModel):
    index: int
    status: Literal["success", "error"]
    audio_data: str | None = Field(default=None, description="Base64 of the encoded audio.")
    media_type: str | None = None
    sample_rate: int | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = Field(default=None, description="What was wrong with this item.")
    param: str | None = None
    code: str | None = None
    status_code: int | None = Field(default=None, description="The HTTP status this item "
                                    "would have had as a single request.")


class SpeechBatchResponse(BaseModel):
    id: str
    object: Literal["speech.batch"] = "speech.batch"
    results: list[BatchItemResult]
    total: int
    succeeded: int
    failed: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail


class VoiceObject(BaseModel):
    object: Literal["voice"] = "voice"
    name: str
    ref_text: str | None
    created_at: int
    duration_s: float
    sample_rate_hz: int
    consent: str | None = None
    speaker_description: str | None = None


class VoiceCreated(VoiceObject):
    replaced: bool = Field(description="true when overwrite=true replaced a voice of this name")


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceObject]
    voices: list[str] = Field(description="The names in `data` (vllm-omni's list shape).")
    uploaded_voices: list[VoiceObject] = Field(
        description="The same voices as `data`, under vllm-omni's key.")


class VoiceDeleted(BaseModel):
    object: Literal["voice.deleted"] = "voice.deleted"
    name: str
    deleted: bool


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class WatermarkDetection(BaseModel):
    detected: bool = Field(description="true when the audio carries the higgs-serve watermark: "
                                       "verdict is `marked`")
    verdict: Literal["marked", "not_marked", "inconclusive"] = Field(
        description="marked; not_marked (speech, no mark); inconclusive (too little speech-like "
                    "signal to judge, e.g. tones, noise, silence or music, or a mark in part of "
                    "the audio only)")
    reason: Literal["too_little_speech", "marked_in_part"] | None = Field(
        default=None, description="why the verdict is inconclusive (null otherwise): "
                                  "too_little_speech (not speech-like enough to judge, whatever "
                                  "the score) or marked_in_part (the mark in part of the frames only)")
    score: float = Field(description="the detector network's output, 0 (unmarked) to 1 (marked): "
                                     "meaningful for speech only (see verdict)")


ERROR_RESPONSES = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (404, "Unknown model"), (413, "Input or body too long"),
        (429, "Queue full; retry after Retry-After seconds"), (500, "Unexpected server error"),
        (503, "Engine not ready or dead, or the server is shutting down"),
    ]
}
