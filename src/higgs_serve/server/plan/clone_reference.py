"""A speech request's voice-cloning reference -> the engine's `ReferenceAudio` (or None).

A request names at most one reference, in one of the forms clients use:

    voice / speaker       a registered voice (its codes cached on disk and in memory)
    ref_audio + ref_text  one clip: base64, data: URI, allow-listed URL, or a local file
    references[0]         Boson's shape: {audio_path | ref_audio | audio | data, text}
    reference_codes       codes [T, 8] already encoded (+ reference_text): no encoder run

Naming two of them, or a transcript without its audio, is a 400 that says which.
"""

from __future__ import annotations

import asyncio

import numpy as np

from higgs_serve.engine.speech import ReferenceAudio
from higgs_serve.errors import InvalidRequestError
from higgs_serve.server.errors import ApiError
from higgs_serve.server.plan.local_media import is_local_reference, read_local_reference
from higgs_serve.server.plan.ref_audio import ref_audio_bytes
from higgs_serve.server.schemas import SpeechFields
from higgs_serve.server.state import ServerState
from higgs_serve.voices.reference_encoder import reference_audio
from higgs_serve.voices.registry import Voice, normalise_reference

DEFAULT_VOICE = "default"
# OpenAI's stock voices: refused with a pointer to what exists, rather than silently mapped.
OPENAI_VOICES = frozenset({
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
    "verse", "marin", "cedar",
})


def voice_name(body: SpeechFields) -> str:
    """`voice` merged with its alias `speaker`."""
    voice = body.voice
    if body.speaker is None:
        return voice
    if "voice" in body.model_fields_set and voice not in (DEFAULT_VOICE, body.speaker):
        raise InvalidRequestError(
            f"speaker {body.speaker!r} and voice {voice!r} differ; speaker is an alias of "
            "voice: send one of them", param="speaker")
    return body.speaker


async def resolve_reference(body: SpeechFields, state: ServerState) -> ReferenceAudio | None:
    """The cloning reference the request names, or None for zero-shot."""
    asked = voice_name(body)
    voice = state.settings.voice_alias_map.get(asked, asked)  # --voice-alias alloy=default
    _check_one_reference(body, voice)
    limit = state.settings.max_input_chars
    for param, transcript in (("ref_text", body.ref_text), ("reference_text", body.reference_text),
                              ("references[0].text", body.references[0].text if body.references else None)):
        check_ref_text_length(transcript, limit, param)
    if body.reference_codes is not None:
        codes = np.asarray(body.reference_codes, dtype=np.int64)  # shape and range: schemas.py
        return reference_audio(codes, body.reference_text)
    if body.references is not None:
        clip = body.references[0]
        value, field = clip.source()
        return await _encoded_clip(value, f"references[0].{field}", clip.text, state)
    if body.ref_audio is not None:
        return await _encoded_clip(body.ref_audio, "ref_audio", body.ref_text, state)
    if voice == DEFAULT_VOICE:
        return None
    return await _registered_voice(voice, state, asked)


def check_ref_text_length(ref_text: str | None, max_chars: int, param: str = "ref_text") -> None:
    """413 past the input limit: a transcript is tokenized like `input`, and bounded alike."""
    if ref_text is not None and len(ref_text) > max_chars:
        raise ApiError(413, f"{param} is {len(ref_text)} characters; the limit is {max_chars}",
                       param=param, code="ref_text_too_long")


def _check_one_reference(body: SpeechFields, voice: str) -> None:
    given = [name for name, present in (
        ("voice", voice != DEFAULT_VOICE), ("ref_audio", body.ref_audio is not None),
        ("references", body.references is not None),
        ("reference_codes", body.reference_codes is not None)) if present]
    if len(given) > 1:
        raise InvalidRequestError(
            f"give one reference per request, not both {' and '.join(given)}: either voice "
            "or ref_audio, references or reference_codes", param=given[-1])
    if body.ref_text and body.ref_audio is None:  # "" (no transcript) is as good as absent
        raise InvalidRequestError("ref_text needs ref_audio (the transcript of that clip)",
                                  param="ref_text")
    if body.reference_text is not None and body.reference_codes is None:
        raise InvalidRequestError(
            "reference_text needs reference_codes (the transcript of those codes)",
            param="reference_text")


async def _encoded_clip(value: str, param: str, transcript: str | None,
                        state: ServerState) -> ReferenceAudio:
    data = await clip_bytes(value, param, state)
    audio = await state.audio_workers.run(normalise_reference, data, state.engine.sample_rate_hz, param)
    codes = await state.audio_workers.run(_encoder(state, param), audio)
    return reference_audio(codes, transcript)


async def clip_bytes(value: str, param: str, state: ServerState) -> bytes:
    """A clip's file bytes from a local file, base64, data: URI or allow-listed URL."""
    settings = state.settings
    if is_local_reference(value):
        return await asyncio.to_thread(read_local_reference, value,
                                       settings.allowed_local_media_path,
                                       settings.max_ref_audio_bytes, param)
    try:
        return await ref_audio_bytes(value, settings.allowed_ref_audio_domains,
                                     settings.max_ref_audio_bytes)
    except InvalidRequestError as error:
        if param == "ref_audio":
            raise
        raise InvalidRequestError(f"{param}: {error}", param=param) from error


async def _registered_voice(name: str, state: ServerState, asked: str) -> ReferenceAudio:
    """name: the registered voice; asked: what the request said (an alias of it, or the same)."""
    voice = state.voices.get(name)
    if voice is None:
        if asked != name:
            raise InvalidRequestError(
                f"voice {asked!r} stands for {name!r} (--voice-alias), which is not registered; "
                "register it with POST /v1/audio/voices", param="voice")
        hint = (" OpenAI's stock voices do not exist for this model (a server can map them to "
                "its voices with --voice-alias)." if name in OPENAI_VOICES else "")
        raise InvalidRequestError(
            f"unknown voice {name!r}.{hint} Use 'default', a voice registered with "
            "POST /v1/audio/voices, or ref_audio + ref_text", param="voice")
    encoder = _encoder(state, "voice")
    # by the Voice looked up above, not its name: deleted meanwhile is a 409 (ConflictError), and
    # codes of a voice replaced while it was encoding are not stored into its successor
    codes = state.voices.cached_codes(voice)
    if codes is None:
        codes = await state.audio_workers.run(_encode_voice, state, voice, encoder)
    return reference_audio(codes, voice.ref_text)


def _encode_voice(state: ServerState, voice: Voice, encoder) -> np.ndarray:
    """On an audio worker: the stored clip read (decoded), encoded, and its codes [T, 8] written
    beside it (fsynced), none of it on the event loop."""
    codes = encoder(state.voices.load_audio(voice))
    state.voices.store_codes(voice, codes)
    return codes


def _encoder(state: ServerState, param: str):
    if state.reference_encoder is None:
        raise InvalidRequestError(
            "voice cloning is not enabled on this server (no reference encoder is loaded); "
            "use voice 'default'", param=param)
    return state.reference_encoder
