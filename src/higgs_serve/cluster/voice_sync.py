"""Registered voices across replicas: one canonical registry in front, copied to every replica.

The front end validates and stores an upload once (the same `VoiceRegistry` the single server
uses, in its own --voices-dir), then fans it out to every replica's voice API. Each replica keeps
its own copy, so nothing needs a shared filesystem and a replica on another host works the same.
A replica that was down, restarted or started later is reconciled against the canonical list
before it takes traffic (missing voices added, deleted ones removed). Every replica receives the
same normalised 24 kHz clip, so all of them encode it to the same reference codes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping

import httpx

from higgs_serve.voices.registry import Voice, VoiceRegistry

logger = logging.getLogger(__name__)


def upload_fields(voice: Voice) -> dict[str, str]:
    """The form fields that recreate `voice` on a replica (replacing one of the same name)."""
    data = {"name": voice.name, "overwrite": "true"}
    for key in ("ref_text", "consent", "speaker_description"):
        value = getattr(voice, key, None)
        if value:
            data[key] = value
    return data


async def push_voice(client: httpx.AsyncClient, url: str, voice: Voice, audio: bytes) -> None:
    """Register `voice` (its normalised clip `audio`, wav bytes) on the replica at `url`."""
    response = await client.post(f"{url}/v1/audio/voices", data=upload_fields(voice),
                                 files={"audio_sample": ("audio.wav", audio, "audio/wav")})
    response.raise_for_status()


class FanOutRegistry(VoiceRegistry):
    """The front end's canonical registry: every successful add or delete is then applied to
    the replicas by `on_change(kind, voice_or_name)`, in the same worker thread, before the
    upload or delete request is answered."""

    def __init__(self, directory, sample_rate_hz: int, on_change: Callable[[str, object], None]):
        super().__init__(directory, sample_rate_hz)
        self.on_change = on_change

    def register(self, name: str, audio_bytes: bytes, ref_text: str | None = None,
                 **options) -> tuple[Voice, bool]:  # `add` comes here too
        voice, replaced = super().register(name, audio_bytes, ref_text, **options)
        self.on_change("add", voice)
        return voice, replaced

    def delete(self, name: str) -> bool:
        deleted = super().delete(name)
        if deleted:
            self.on_change("delete", name)
        return deleted


def stored_audio(registry: VoiceRegistry, name: str) -> bytes:
    """The canonical normalised clip of a registered voice (wav bytes)."""
    return (registry.directory / name / "audio.wav").read_bytes()


async def remove_voice(client: httpx.AsyncClient, url: str, name: str) -> None:
    response = await client.delete(f"{url}/v1/audio/voices/{name}")
    if response.status_code != 404:
        response.raise_for_status()


async def reconcile(client: httpx.AsyncClient, url: str, wanted: Mapping[str, Voice],
                    audio: Callable[[str], Awaitable[bytes]], *, push_all: bool = False,
                    again: Collection[str] = ()) -> None:
    """Make the replica at `url` hold exactly the voices `wanted` (name -> Voice); `audio(name)`
    fetches a clip. push_all: send every wanted voice again (overwriting), for a replica that may
    have missed a replacement; else the ones it lacks and those named in `again` (replaced since
    it last got them)."""
    listed = await client.get(f"{url}/v1/audio/voices")
    listed.raise_for_status()
    present = {item["name"] for item in listed.json()["data"]}
    for name in sorted(present - wanted.keys()):
        await remove_voice(client, url, name)
    pushed = wanted.keys() if push_all else (wanted.keys() - present) | (wanted.keys() & set(again))
    for name in sorted(pushed):
        await push_voice(client, url, wanted[name], await audio(name))


def voice_json(voice: Voice) -> dict:
    return {"object": "voice", "name": voice.name, "ref_text": voice.ref_text,
            "created_at": voice.created_at, "duration_s": voice.duration_s,
            "sample_rate_hz": voice.sample_rate_hz, "consent": voice.consent,
            "speaker_description": voice.speaker_description}
