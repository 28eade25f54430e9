"""A validated speech request -> `SpeechPlan`: everything checked before any response starts.

The schema (schemas.py) has checked types and ranges; this module checks what needs the running
server: the model name, the input limit, format/stream/rate combinations, the first-chunk size,
the reference (clone_reference.py) and the profile's sampling limits. Every failure is an
`ApiError` or `InvalidRequestError` naming the field, so a streaming response never opens for a
request that cannot succeed. HTTP requests reach it through speech_run.admit_plan (admission first).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from higgs_serve.alignment import aligner_for
from higgs_serve.audio.formats import FORMATS, output_rate_hz
from higgs_serve.engine.deadlines.playback_clock import Playback
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.errors import InvalidRequestError
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.server.plan.clone_reference import resolve_reference
from higgs_serve.server.errors import ApiError
from higgs_serve.server.peer_fields import AUTO
from higgs_serve.server.schemas import SpeechRequestBody
from higgs_serve.server.state import ServerState

Mode = Literal["file", "audio", "sse"]


@dataclass(frozen=True)
class SpeechPlan:
    request: SpeechRequest
    mode: Mode
    response_format: str
    speed: float
    input_tokens: int  # text tokens of `input` (usage)
    sample_rate_hz: int  # of the response (the engine's 24 kHz resampled when asked)
    language: str  # "auto" or the language name the request gave (X-Language)
    # word_timestamps: the aligner that times the words (alignment/registry.py); None: not asked
    aligner: str | None = None
    # a raw stream asking for word timestamps is answered as a file: their header precedes the body
    buffered: bool = False


async def build_plan(body: SpeechRequestBody, state: ServerState) -> SpeechPlan:
    settings = state.settings
    _check_model(body.model, state)
    if len(body.input) > settings.max_input_chars:
        raise ApiError(413, f"input is {len(body.input)} characters; the limit is "
                       f"{settings.max_input_chars}", param="input", code="input_too_long")
    if body.instructions:
        raise InvalidRequestError(
            "instructions are not supported: Higgs-Audio V3 cannot follow free-form style "
            "instructions; leave the field out", param="instructions")
    sample_rate_hz = output_rate_hz(body.response_format, body.sample_rate,
                                    state.engine.sample_rate_hz)  # the format's checks too
    mode = _mode(body)
    _check_initial_chunk(body, mode, state)
    aligner = _check_word_timestamps(body, state)
    buffered = aligner is not None and mode == "audio"
    if buffered:
        if body.initial_codec_chunk_frames is not None:
            raise InvalidRequestError(
                "initial_codec_chunk_frames sets the first streamed chunk, but a raw stream with "
                "word_timestamps is sent whole (its X-Word-Timestamps header precedes the body): "
                "drop one, or use stream_format 'sse'", param="initial_codec_chunk_frames")
        mode = "file"
    reference = await resolve_reference(body, state)
    sampling = SamplingParams.from_defaults(
        state.engine.deploy.stage0.default_sampling_params,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
        max_new_tokens=body.max_new_tokens, min_new_tokens=body.min_new_tokens)
    # a stream is heard as it is made: its deadlines order the engine's work, and a stream the
    # server cannot start within --ttfa-budget-s is refused at once (docs/api.md#over-capacity)
    playback = Playback(body.speed, settings.ttfa_budget_s) if mode != "file" else None
    request = SpeechRequest(request_id=f"speech-{uuid.uuid4().hex}", text=body.input,
                            sampling=sampling, stream=mode != "file", reference=reference,
                            initial_chunk_frames=body.initial_codec_chunk_frames, playback=playback)
    return SpeechPlan(request=request, mode=mode, response_format=body.response_format,
                      speed=body.speed, input_tokens=_count_tokens(body.input, state),
                      sample_rate_hz=sample_rate_hz, language=body.language or AUTO,
                      aligner=aligner, buffered=buffered)


def _check_model(model: str | None, state: ServerState) -> None:
    accepted = (*state.settings.served_model_names, *state.settings.model_aliases)
    if model is not None and model not in accepted:
        names = ", ".join(repr(name) for name in state.settings.served_model_names)
        raise ApiError(404, f"model {model!r} is not served here; use {names}", param="model",
                       code="model_not_found")


def _mode(body: SpeechRequestBody) -> Mode:
    """The streaming rule (docs/api.md#streaming): a request streams unless it says `stream:
    false` (file: one encoded body, exact file windows), or it does not ask to stream (neither
    `stream: true` nor a `stream_format`) and its format's header states the length (wav, flac):
    a client that did not ask to stream is saving a file, and a streamed header cannot know the
    length. `stream_format` picks raw audio or SSE."""
    if body.stream is False:
        if body.stream_format is not None:
            raise InvalidRequestError(
                f"stream_format {body.stream_format!r} streams the response, but stream is "
                "false; drop one of them", param="stream_format")
        return "file"
    asked_to_stream = body.stream is True or body.stream_format is not None
    if not asked_to_stream and FORMATS[body.response_format].header_states_length:
        return "file"
    return body.stream_format or "audio"


def _check_word_timestamps(body: SpeechRequestBody, state: ServerState) -> str | None:
    """The aligner for a request asking for word timestamps (docs/api.md#word-timestamps), or
    a 400 naming the field: the server runs no aligner processes, or the language has no
    aligner (checked on the text itself with language 'auto')."""
    if not body.word_timestamps:
        return None
    if state.aligner_pool is None:
        raise InvalidRequestError(
            "word_timestamps: this server was started with --alignment-workers 0 (no aligner); "
            "leave word_timestamps out", param="word_timestamps")
    aligner = aligner_for(body.language or AUTO, body.input)
    state.aligner_pool.warm(aligner)
    return aligner


def _check_initial_chunk(body: SpeechRequestBody, mode: Mode, state: ServerState) -> None:
    """initial_codec_chunk_frames shapes the first streamed chunk: streaming only, at most C."""
    frames = body.initial_codec_chunk_frames
    if frames is None:
        return
    if mode == "file":
        why = ("a request with stream: false is not streamed (leave stream out)"
               if body.stream is False else
               f"a {body.response_format} request without stream: true is answered as one file "
               "(its header states the length); send stream: true to stream it")
        raise InvalidRequestError(f"initial_codec_chunk_frames sets the first streamed chunk; {why}",
                                  param="initial_codec_chunk_frames")
    limit = state.engine.deploy.streaming.codec_chunk_frames
    if frames > limit:
        raise InvalidRequestError(
            f"initial_codec_chunk_frames {frames} is above this profile's codec_chunk_frames "
            f"({limit}); send 0-{limit} (0 = start with {limit}-frame chunks)",
            param="initial_codec_chunk_frames")


def _count_tokens(text: str, state: ServerState) -> int:
    builder = state.engine.prompt_builder
    return builder.count_text_tokens(text) if builder is not None else 0
