"""`session.config` of WS /v1/audio/speech/stream -> a validated plan, with the REST rules.

The REST fields (voice, response_format, seed, sampling, ref_audio, ...) are validated by the same
schema (SpeechRequestBody) and the same plan builder (speech_plan.build_plan) as
POST /v1/audio/speech, as a streaming request, so every limit and error message is the REST one.
The WebSocket-only fields are checked here:

    stream_audio     true (default): send each sentence's audio as it is generated;
                     false: one binary message per sentence, when it is complete
    audio_transport  "binary" (default): audio in binary WebSocket messages;
                     "base64": audio.chunk JSON events carrying base64 audio
    protocol         "vllm-omni" (default): input.done ends an utterance (session.done), the
                     session stays open; "sglang-omni": a session.configured reply, and
                     input.done ends the session. A config nested under `session` (sglang-omni's
                     client) defaults to "sglang-omni".
    split_granularity  "sentence" only (the peers' name for what this server does)

`word_timestamps` (a REST field, checked by build_plan: aligner processes, language) switches
the audio to vllm-omni's JSON `audio.chunk` frames (websocket/transport.py TimestampedAudio), so it does not
combine with `audio_transport`; sglang-omni's protocol has no timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from higgs_serve.errors import InvalidRequestError
from higgs_serve.server.errors import describe_validation_errors
from higgs_serve.server.schemas import SpeechRequestBody
from higgs_serve.server.plan.speech_plan import SpeechPlan, build_plan
from higgs_serve.server.state import ServerState

# REST fields that describe one request's text or response shape, not a session
NOT_IN_SESSIONS = ("input", "stream", "stream_format")
PLACEHOLDER_INPUT = "session"  # build_plan validates a request; segments replace its text


class SessionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    stream_audio: bool = True
    audio_transport: Literal["binary", "base64"] = "binary"
    protocol: Literal["vllm-omni", "sglang-omni"] = "vllm-omni"
    # what the peers' clients send; sentences are what this server speaks, so only that value
    split_granularity: Literal["sentence"] = "sentence"


@dataclass(frozen=True)
class SessionConfig:
    plan: SpeechPlan  # request = the session's base request (voice, sampling, format)
    options: SessionOptions


async def parse_session_config(message: dict, state: ServerState) -> SessionConfig:
    """Raises InvalidRequestError / ApiError naming the field, exactly as REST would."""
    fields = _session_fields(message)
    for name in NOT_IN_SESSIONS:
        if name in fields:
            raise InvalidRequestError(
                f"{name} is not a session field: send text with input.text messages; audio "
                "always streams", param=name)
    own = {k: fields.pop(k) for k in list(fields) if k in SessionOptions.model_fields}
    options = _validated(SessionOptions, own)
    body = _validated(SpeechRequestBody, {**fields, "input": PLACEHOLDER_INPUT, "stream": True})
    if body.speed != 1.0:  # audio.done's timings count the engine's samples, unstretched
        raise InvalidRequestError("speed is not offered on the WebSocket: send 1.0 or leave it out",
                                  param="speed")
    if body.word_timestamps:
        _check_word_timestamps(options)
    plan = await build_plan(body, state)
    return SessionConfig(plan=plan, options=options)


def _check_word_timestamps(options: SessionOptions) -> None:
    if options.protocol == "sglang-omni":
        raise InvalidRequestError(
            "word_timestamps is not part of the sglang-omni protocol (it has no timestamps): "
            "leave word_timestamps out, or use protocol vllm-omni", param="word_timestamps")
    if "audio_transport" in options.model_fields_set:
        raise InvalidRequestError(
            "word_timestamps sends the audio in audio.chunk JSON frames (audio_b64) beside the "
            "timestamps: leave audio_transport out", param="audio_transport")


def transport_name(config: SessionConfig) -> str:
    """The session's audio transport (server/websocket/transport.py)."""
    return "timestamped" if config.plan.aligner is not None else config.options.audio_transport


def _validated(model: type[BaseModel], fields: dict):
    try:
        return model.model_validate(fields)
    except ValidationError as error:
        message, param = describe_validation_errors(list(error.errors()))
        raise InvalidRequestError(message, param=param) from None


def _session_fields(message: dict) -> dict:
    """The config's fields: top level (vllm-omni), or nested under `session` as sglang-omni's
    client sends them, which then means protocol sglang-omni unless the config says otherwise."""
    fields = {k: v for k, v in message.items() if k != "type"}
    if "session" not in fields:
        return fields
    nested = fields.pop("session")
    if not isinstance(nested, dict):
        raise InvalidRequestError("session must be an object holding the session's fields",
                                  param="session")
    if fields:
        raise InvalidRequestError(
            f"give the session's fields either at the top level or under session, not both "
            f"({', '.join(sorted(fields))} beside session)", param=sorted(fields)[0])
    return {"protocol": "sglang-omni", **nested}
