"""GET / POST /v1/audio/voices, DELETE /v1/audio/voices/{name}: the persisted voice registry."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from higgs_serve.errors import ConflictError
from higgs_serve.server.errors import ApiError
from higgs_serve.server.schemas import (
    ERROR_RESPONSES,
    VoiceCreated,
    VoiceDeleted,
    VoiceList,
    VoiceObject,
)
from higgs_serve.server.plan.clone_reference import check_ref_text_length
from higgs_serve.server.state import server_state
from higgs_serve.voices.registry import MAX_UPLOAD_BYTES, Voice, check_voice_name

router = APIRouter(prefix="/v1/audio/voices", tags=["voices"])
UPLOAD_FIELDS = ("audio_sample", "name", "ref_text", "consent", "speaker_description",
                 "overwrite")


async def read_upload(form_keys, name: str, audio_sample) -> bytes:
    """The upload's checks before anything is stored (unknown fields, the name, the size),
    shared with the cluster's voice endpoints. Returns the clip's bytes."""
    unknown = sorted(set(form_keys) - set(UPLOAD_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", param=",".join(unknown))
    check_voice_name(name)
    data = await audio_sample.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise ApiError(413, f"audio_sample exceeds the limit of {MAX_UPLOAD_BYTES} bytes",
                       param="audio_sample", code="file_too_large")
    return data


def voice_exists(name: str) -> ApiError:
    return ApiError(409, f"voice {name!r} already exists; delete it first or send "
                    "overwrite=true", param="name", code="voice_exists")


def voice_missing(name: str) -> ApiError:
    return ApiError(404, f"voice {name!r} does not exist", param="name", code="voice_not_found")


def _voice_object(voice: Voice) -> VoiceObject:
    return VoiceObject(name=voice.name, ref_text=voice.ref_text, created_at=voice.created_at,
                       duration_s=voice.duration_s, sample_rate_hz=voice.sample_rate_hz,
                       consent=voice.consent, speaker_description=voice.speaker_description)


@router.get("", response_model=VoiceList)
async def list_voices(request: Request) -> VoiceList:
    voices = [_voice_object(v) for v in server_state(request).voices.list()]
    return VoiceList(data=voices, voices=[voice.name for voice in voices],
                     uploaded_voices=voices)


@router.post("", response_model=VoiceCreated, responses={409: ERROR_RESPONSES[400],
                                                         **ERROR_RESPONSES})
async def create_voice(
    request: Request,
    audio_sample: Annotated[UploadFile, File(description="Reference clip (wav/flac/ogg/mp3, "
                                                         "<= 10 MB, 0.5-30 s).")],
    name: Annotated[str, Form(description="Voice name: letters, digits, '_', '-', '.'.")],
    ref_text: Annotated[str | None, Form(description="Transcript of the clip.")] = None,
    consent: Annotated[str | None, Form(description="The uploader's consent reference; "
                                                    "kept and returned.")] = None,
    speaker_description: Annotated[str | None, Form(description="Free text about the voice; "
                                                                "kept and returned.")] = None,
    overwrite: Annotated[bool, Form(description="true: replace a voice of the same name "
                                                "(otherwise that is a 409).")] = False,
) -> VoiceCreated:
    data = await read_upload((await request.form()).keys(), name, audio_sample)
    check_ref_text_length(ref_text, server_state(request).settings.max_input_chars)
    voices = server_state(request).voices
    if voices.get(name) is not None and not overwrite:  # early: before the clip is decoded
        raise voice_exists(name)
    register = partial(voices.register, consent=consent, speaker_description=speaker_description,
                       overwrite=overwrite)
    try:
        voice, replaced = await server_state(request).audio_workers.run(register, name, data,
                                                                        ref_text)
    except ConflictError as error:  # another upload of the name won the race
        raise voice_exists(name) from error
    return VoiceCreated(**_voice_object(voice).model_dump(), replaced=replaced)


@router.delete("/{name}", response_model=VoiceDeleted, responses={404: ERROR_RESPONSES[400]})
async def delete_voice(name: str, request: Request) -> VoiceDeleted:
    if not await asyncio.to_thread(server_state(request).voices.delete, name):
        raise voice_missing(name)
    return VoiceDeleted(name=name, deleted=True)
