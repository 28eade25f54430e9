"""A validated speech request -> `SpeechPlan`: everything checked before any response starts.

The schema (schemas.py) has checked types and ranges; this module checks what needs the running
server: the model name, the input limit, format/stream combinations, the voice, the reference
clip and the profile's sampling limits. Every failure is an `ApiError` or `InvalidRequestError`
naming the field, so a streaming response never opens for a request that cannot succeed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from higgs_serve.audio.formats import STREAMABLE_FORMATS, check_format
from higgs_serve.engine.speech import ReferenceAudio, SpeechRequest
from higgs_serve.errors import InvalidRequestError
from higgs_serve.sampling_params import SamplingParams
from higgs_serve.server.errors import ApiError
from higgs_serve.server.ref_audio import ref_audio_bytes
from higgs_serve.server.schemas import SpeechRequestBody
from higgs_serve.server.state import ServerState
from higgs_serve.voices.reference_encoder import reference_audio
from higgs_serve.voices.registry import normalise_reference

Mode = Literal["file", "audio", "sse"]

# OpenAI's stock voices: refused with a pointer to what exists, rather than silently mapped.
OPENAI_VOICES = frozenset({
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
    "verse", "marin", "cedar",
})


@dataclass(frozen=True)
class SpeechPlan:
    request: SpeechRequest
    mode: Mode
    response_format: str
    speed: float
    input_tokens: int  # text tokens of `input` (usage)


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
    check_format(body.response_format)
    mode = _mode(body)
    reference = await _reference(body, state)
    sampling = SamplingParams.from_defaults(
        state.engine.deploy.stage0.default_sampling_params,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
        max_new_tokens=body.max_new_tokens, min_new_tokens=body.min_new_tokens)
    request = SpeechRequest(request_id=f"speech-{uuid.uuid4().hex}", text=body.input,
                            sampling=sampling, stream=mode != "file", reference=reference)
    return SpeechPlan(request=request, mode=mode, response_format=body.response_format,
                      speed=body.speed, input_tokens=_count_tokens(body.input, state))


def _check_model(model: str | None, state: ServerState) -> None:
    accepted = (state.settings.served_model_name, *state.settings.model_aliases)
    if model is not None and model not in accepted:
        raise ApiError(404, f"model {model!r} is not served here; use "
                       f"{state.settings.served_model_name!r}", param="model",
                       code="model_not_found")


def _mode(body: SpeechRequestBody) -> Mode:
    """file: one encoded body; audio: raw chunked pcm/wav; sse: speech.audio.* events."""
    if body.stream is False and body.stream_format is not None:
        raise InvalidRequestError(
            f"stream_format {body.stream_format!r} streams the response, but stream is false; "
            "drop one of them", param="stream_format")
    if body.stream_format is None and not body.stream:
        return "file"
    mode: Mode = body.stream_format or "audio"
    if body.response_format not in STREAMABLE_FORMATS:
        raise InvalidRequestError(
            f"streaming supports response_format {' or '.join(STREAMABLE_FORMATS)}, not "
            f"{body.response_format!r}; request it without streaming instead",
            param="response_format")
    if body.speed != 1.0:
        raise InvalidRequestError(
            "speed is applied to the finished audio, so it needs a non-streaming request "
            "(speed must be 1.0 when streaming)", param="speed")
    return mode


async def _reference(body: SpeechRequestBody, state: ServerState) -> ReferenceAudio | None:
    """The cloning reference from `voice` or `ref_audio`, or None for zero-shot."""
    if body.voice != "default" and body.ref_audio is not None:
        raise InvalidRequestError("give either voice or ref_audio, not both", param="ref_audio")
    check_ref_text_length(body.ref_text, state.settings.max_input_chars)
    if body.ref_audio is None and body.ref_text:  # "" (no transcript) is as good as absent
        raise InvalidRequestError("ref_text needs ref_audio (the transcript of that clip)",
                                  param="ref_text")
    if body.ref_audio is not None:
        data = await ref_audio_bytes(body.ref_audio, state.settings.allowed_ref_audio_domains,
                                     state.settings.max_ref_audio_bytes)
        audio = await state.audio_workers.run(
            normalise_reference, data, state.engine.sample_rate_hz, "ref_audio")
        encoder = _encoder(state, "ref_audio")
        codes = await state.audio_workers.run(encoder, audio)
        return reference_audio(codes, body.ref_text)
    if body.voice == "default":
        return None
    return await _registered_voice(body.voice, state)


async def _registered_voice(name: str, state: ServerState) -> ReferenceAudio:
    voice = state.voices.get(name)
    if voice is None:
        hint = (" OpenAI's stock voices do not exist for this model." if name in OPENAI_VOICES
                else "")
        raise InvalidRequestError(
            f"unknown voice {name!r}.{hint} Use 'default', a voice registered with "
            "POST /v1/audio/voices, or ref_audio + ref_text", param="voice")
    encoder = _encoder(state, "voice")
    # by the Voice looked up above, not its name: deleted meanwhile is a 409 (ConflictError), and
    # codes of a voice replaced while it was encoding are not stored into its successor
    codes = state.voices.cached_codes(voice)
    if codes is None:
        audio = state.voices.load_audio(voice)
        codes = await state.audio_workers.run(encoder, audio)
        state.voices.store_codes(voice, codes)
    return reference_audio(codes, voice.ref_text)


def _encoder(state: ServerState, param: str):
    if state.reference_encoder is None:
        raise InvalidRequestError(
            "voice cloning is not enabled on this server (no reference encoder is loaded); "
            "use voice 'default'", param=param)
    return state.reference_encoder


def check_ref_text_length(ref_text: str | None, max_chars: int) -> None:
    """413 past the input limit: the transcript is tokenized like `input`, and bounded alike."""
    if ref_text is not None and len(ref_text) > max_chars:
        raise ApiError(413, f"ref_text is {len(ref_text)} characters; the limit is {max_chars}",
                       param="ref_text", code="ref_text_too_long")


def _count_tokens(text: str, state: ServerState) -> int:
    builder = state.engine.prompt_builder
    return builder.count_text_tokens(text) if builder is not None else 0
