"""Request and response bodies of the HTTP API (pydantic), the OpenAPI schema's source.

Requests are strict (`"1"` is not an int) and closed (`extra="forbid"`): a field the server does
not know is a 400 that names it, never silently dropped. Checks that need the running server
(served model name, input length limit, registered voices, profile limits) live in
server/speech_plan.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from higgs_serve.audio.time_stretch import MAX_SPEED, MIN_SPEED

ResponseFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]
StreamFormat = Literal["audio", "sse"]


class SpeechRequestBody(BaseModel):
    """POST /v1/audio/speech."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: str = Field(min_length=1, description="Text to speak (non-empty; length-capped).")
    model: str | None = Field(
        default=None, description="The served model name or the model path/hub id it was "
        "started with; may be omitted.")
    voice: str = Field(
        default="default", description="'default' (zero-shot) or a voice registered through "
        "POST /v1/audio/voices. OpenAI's stock voice names are not available (400).")
    response_format: ResponseFormat = Field(
        default="wav", description="wav (default), pcm (raw s16le), flac, mp3, opus (Ogg). "
        "aac is refused in this build: no packaged encoder.")
    speed: float = Field(
        default=1.0, ge=MIN_SPEED, le=MAX_SPEED,
        description="Playback speed via pitch-preserving time stretch; non-streaming only.")
    stream: bool | None = Field(
        default=None, description="true: stream audio as it is generated (raw audio unless "
        "stream_format is 'sse').")
    stream_format: StreamFormat | None = Field(
        default=None, description="'audio' (raw chunked pcm/wav) or 'sse' (speech.audio.* "
        "events); either one implies streaming.")
    instructions: str | None = Field(
        default=None, description="Not supported by Higgs-Audio V3: a non-empty value is a 400.")
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
        default=None, description="Reference clip for cloning: base64 or a data: URI (an "
        "http(s) URL only if its host is on the server's allow-list).")
    ref_text: str | None = Field(default=None, description="Transcript of ref_audio.")

    @field_validator("input")
    @classmethod
    def _input_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must contain non-whitespace text")
        return value


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


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


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceObject]


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


ERROR_RESPONSES = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (404, "Unknown model"), (413, "Input or body too long"),
        (429, "Queue full; retry after Retry-After seconds"), (500, "Unexpected server error"),
        (503, "Engine not ready or dead, or the server is shutting down"),
    ]
}
